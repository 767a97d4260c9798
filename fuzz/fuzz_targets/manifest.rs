//! Tool manifests: any text is either loaded or refused with located problems, never a panic;
//! a loaded tool validates and renders arbitrary arguments without panicking.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (toml, args) = text.split_once('\u{1}').unwrap_or((&text, "{}"));
    match postern_engine::Manifest::parse(toml, std::path::Path::new("fuzz.toml")) {
        Ok(manifest) => {
            let Ok(arguments) = serde_json::from_str::<serde_json::Value>(args) else { return };
            for tool in manifest.tools() {
                if let Ok(valid) = tool.validate_arguments(&arguments) {
                    if tool.ssh.is_some() {
                        let _ = tool.render_ssh(&valid);
                    } else {
                        let _ = tool.render(&valid);
                    }
                }
            }
        }
        Err(problems) => assert!(!problems.is_empty(), "a refusal names at least one problem"),
    }
});
