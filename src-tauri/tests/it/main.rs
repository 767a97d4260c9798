//! The desktop app end to end, in a real webview: Xvfb, tauri-driver + WebKitWebDriver, the
//! official Python MCP SDK as the agent, a counting HTTP target (tests/desktop/e2e.py). Run
//! through scripts/test.sh (a D-Bus session with an unlocked keyring around the tests).

#![allow(clippy::unwrap_used)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

/// An X server of our own, on the first free display from :90.
struct Xvfb {
    child: Child,
    display: String,
}

impl Xvfb {
    fn start() -> Xvfb {
        let n = (90..200).find(|n| !Path::new(&format!("/tmp/.X{n}-lock")).exists()).unwrap();
        let child = Command::new("Xvfb")
            .args([&format!(":{n}"), "-screen", "0", "1280x900x24", "-nolisten", "tcp"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("Xvfb (apt install xvfb; .ci/run does)");
        let socket = format!("/tmp/.X11-unix/X{n}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !Path::new(&socket).exists() {
            assert!(Instant::now() < deadline, "Xvfb :{n} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Xvfb { child, display: format!(":{n}") }
    }
}

impl Drop for Xvfb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn approvals_and_retry_review_in_the_real_app() {
    // POSTERN_SCREENSHOTS=DIR keeps the screenshots (the book's come from docs/src/screenshots).
    for tool in ["tauri-driver", "WebKitWebDriver", "dunst", "dunstctl", "dbus-monitor", "xdotool", "import"] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().unwrap();
        assert!(found.status.success(), "{tool} is missing: run the tests through scripts/test.sh");
    }
    let app = PathBuf::from(env!("CARGO_BIN_EXE_postern-app"));
    let postern = app.with_file_name("postern");
    assert!(postern.exists(), "build the CLI too (cargo nextest run --workspace does): {}", postern.display());
    let python = root().join("tests/clients/python/.venv/bin/python");
    assert!(python.exists(), "the Python MCP SDK is not installed: run the tests through scripts/test.sh");
    let x = Xvfb::start();
    // GLib starts D-Bus services (accessibility, portals) that need to know the display.
    let _ = Command::new("dbus-update-activation-environment").arg(format!("DISPLAY={}", x.display)).status();
    let kept = std::env::var_os("POSTERN_SCREENSHOTS");
    let shots = kept.clone().map_or_else(|| tempfile_dir("postern-shots"), PathBuf::from);
    let run = Command::new(python)
        .arg(root().join("tests/desktop/e2e.py"))
        .env("DISPLAY", &x.display)
        .env("POSTERN_APP", &app)
        .env("POSTERN_BIN", &postern)
        .env("SCREENSHOTS", &shots)
        .env("POSTERN_LOG", "warn")
        // The Activity view is timed on a journal of a million executions (printed, not asserted).
        .env("BENCH_ROWS", std::env::var("POSTERN_BENCH_ROWS").unwrap_or_else(|_| "1000000".into()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    println!("{stdout}");
    assert!(run.status.success(), "the desktop E2E failed:\n{stdout}\n{stderr}");
    for shot in [
        "dialog-per-use.png",
        "dialog-session.png",
        "dialog-retry-review.png",
        "view-activity.png",
        "view-sessions.png",
        "view-vault.png",
        "view-tools.png",
        "view-audit.png",
        "view-first-run.png",
        "view-servers.png",
        "notification-approval.png",
    ] {
        assert!(shots.join(shot).exists(), "screenshot {shot} saved");
    }
    if kept.is_none() {
        let _ = std::fs::remove_dir_all(&shots);
    }
}

fn tempfile_dir(prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
