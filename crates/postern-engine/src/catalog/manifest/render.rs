//! A call's validated arguments turned into what is sent: the HTTP request (URL template with
//! encoded components, headers, body) or the SSH command with each argument one quoted word.
//! Validation against the tool's input schema happens here too, so nothing is rendered from
//! arguments that were not checked.

use super::*;

/// The HTTP request a call renders to (before credentials are injected).
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedRequest {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
}

/// Percent-encodes everything but RFC 3986 unreserved characters, for one path segment or
/// query value substituted into a URL template.
fn encode_component(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Tool {
    /// An SSH tool's command for validated `arguments`: each `{name}` becomes the argument's
    /// value as one single-quoted `sh` word (the built-in `ssh_exec` passes its command as is).
    pub fn render_ssh(&self, arguments: &Value) -> Result<String, ArgumentError> {
        let Some(ssh) = &self.ssh else {
            return Err(ArgumentError {
                tool: self.name.clone(),
                field: "/".into(),
                message: "not an SSH tool".into(),
            });
        };
        if ssh.host.is_none() {
            return Ok(arguments["command"].as_str().unwrap_or_default().to_owned());
        }
        ssh.command.render(|p| {
            let value = self.scalar_argument(arguments, p, "command")?;
            if value.contains('\0') {
                return Err(ArgumentError {
                    tool: self.name.clone(),
                    field: format!("/{p}"),
                    message: "contains a NUL character, which a shell word cannot carry".into(),
                });
            }
            if value.starts_with('-') && ssh.option_words.contains(p) {
                return Err(ArgumentError {
                    tool: self.name.clone(),
                    field: format!("/{p}"),
                    message: "starts with `-`, and stands where the command would read it as an option (the \
                              tool's template can put `--` before it to take such values)"
                        .into(),
                });
            }
            Ok(crate::catalog::template::shell_quote(&value))
        })
    }

    /// Argument `p` as text (a string as it is, a number or boolean as JSON), required by the
    /// tool's `what` (url, command).
    fn scalar_argument(&self, arguments: &Value, p: &str, what: &str) -> Result<String, ArgumentError> {
        match arguments.get(p) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => Ok(v.to_string()),
            _ => Err(ArgumentError {
                tool: self.name.clone(),
                field: format!("/{p}"),
                message: format!("required by the tool's {what}"),
            }),
        }
    }

    /// [`Tool::validate_arguments`] for an upstream tool whose contract names an idempotency
    /// argument: checked as it will be sent (with a key there), returned without it (Postern
    /// fills it with the execution ID at dispatch, the same on every recovery).
    pub fn validate_upstream_arguments(
        &self,
        arguments: &Value,
        key_argument: Option<&str>,
    ) -> Result<Value, ArgumentError> {
        let Some(key) = key_argument else { return self.validate_arguments(arguments) };
        let mut with_key = arguments.clone();
        if let Value::Object(map) = &mut with_key {
            map.insert(key.to_owned(), Value::String("act_00000000000000000000000000".into()));
        }
        let mut checked = self.validate_arguments(&with_key)?;
        if let Value::Object(map) = &mut checked {
            map.remove(key);
        }
        Ok(checked)
    }

    /// Fills in the contract's defaults and checks the arguments against the schema. The error
    /// names the first failing field.
    pub fn validate_arguments(&self, arguments: &Value) -> Result<Value, ArgumentError> {
        // A journal row holds the arguments a few levels down; JSON nested near the parser's
        // limit (128) would be accepted here and unreadable there.
        let depth = json_depth(arguments);
        if depth > MAX_ARGUMENT_DEPTH {
            return Err(ArgumentError {
                tool: self.name.clone(),
                field: "/".into(),
                message: format!("arguments nest {depth} levels deep; at most {MAX_ARGUMENT_DEPTH} are accepted"),
            });
        }
        let mut args = match arguments {
            Value::Object(map) => map.clone(),
            Value::Null => serde_json::Map::new(),
            other => {
                return Err(ArgumentError {
                    tool: self.name.clone(),
                    field: "/".into(),
                    message: format!("arguments must be an object, got {other}"),
                });
            }
        };
        args.remove("_meta");
        for (name, default) in &self.contract.defaults {
            args.entry(name.clone()).or_insert_with(|| default.clone());
        }
        let args = Value::Object(args);
        if let Some(error) = self.validator.iter_errors(&args).next() {
            let field = error.instance_path().to_string();
            return Err(ArgumentError {
                tool: self.name.clone(),
                field: if field.is_empty() { "/".into() } else { field },
                message: error.to_string(),
            });
        }
        Ok(args)
    }

    /// The request for validated `arguments`: placeholders in the URL are percent-encoded,
    /// strings `"{name}"` in the body template are replaced by the argument's JSON value, and a
    /// method with a body and no template sends the arguments themselves.
    pub fn render(&self, arguments: &Value) -> Result<RenderedRequest, ArgumentError> {
        // A placeholder before `?` or `#` fills a path segment: `.` and `..` would climb the path.
        let mut in_path = true;
        let mut url = String::new();
        for segment in self.url.segments() {
            match segment {
                Segment::Literal(text) => {
                    in_path &= !text.contains(['?', '#']);
                    url.push_str(text);
                }
                Segment::Placeholder(p) => {
                    let value = self.scalar_argument(arguments, p, "url")?;
                    if in_path && matches!(value.as_str(), "." | "..") {
                        return Err(ArgumentError {
                            tool: self.name.clone(),
                            field: format!("/{p}"),
                            message: format!(
                                "{value:?} is not allowed in a URL path segment (it would change the path)"
                            ),
                        });
                    }
                    url.push_str(&encode_component(&value));
                }
            }
        }
        let body = match (&self.body_template, self.method.as_str()) {
            (Some(template), _) => Some(fill(template, arguments)),
            (None, "GET" | "HEAD" | "DELETE" | "OPTIONS") => None,
            (None, _) => Some(arguments.clone()),
        };
        let mut headers: Vec<(String, String)> = self.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        if body.is_some() && !self.headers.keys().any(|k| k.eq_ignore_ascii_case("content-type")) {
            headers.push(("content-type".into(), "application/json".into()));
        }
        Ok(RenderedRequest {
            method: self.method.clone(),
            url,
            headers,
            body: body.map(|b| serde_json::to_vec(&b).unwrap_or_default()),
        })
    }
}

/// How deeply a call's arguments may nest.
pub const MAX_ARGUMENT_DEPTH: usize = 64;

/// Nesting depth of a JSON value (a scalar is 0), without recursion.
fn json_depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, d)) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items.iter().map(|i| (i, d + 1))),
            Value::Object(map) => stack.extend(map.values().map(|i| (i, d + 1))),
            _ => {}
        }
        deepest = deepest.max(d);
    }
    deepest
}

fn fill(template: &Value, arguments: &Value) -> Value {
    match template {
        Value::String(s) if s.starts_with('{') && s.ends_with('}') && s.len() > 2 => {
            arguments.get(&s[1..s.len() - 1]).cloned().unwrap_or(Value::Null)
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| fill(v, arguments)).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), fill(v, arguments))).collect()),
        other => other.clone(),
    }
}
