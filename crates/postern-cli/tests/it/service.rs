//! `postern service install|uninstall`: the systemd user unit for `postern serve` is written
//! where systemd looks for it, runs this binary on this data directory, and goes away again.

use super::support::postern_with;

#[test]
fn the_service_unit_is_written_for_this_binary_and_removed() {
    let config = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let env = [("XDG_CONFIG_HOME", config.path().to_str().unwrap())];
    let install = postern_with(&["service", "install", "--no-enable"], Some(data.path()), None, &env);
    assert_eq!(install.code, 0, "{}", install.stderr);
    assert!(install.stderr.contains("systemctl --user enable --now postern.service"), "{}", install.stderr);
    assert!(install.stderr.contains("no approver"), "{}", install.stderr);
    let unit = std::fs::read_to_string(config.path().join("systemd/user/postern.service")).unwrap();
    let exec = format!("\nExecStart={} --data-dir {} serve\n", env!("CARGO_BIN_EXE_postern"), data.path().display());
    assert!(unit.contains(&exec), "{unit}");
    assert!(unit.contains("\nWantedBy=default.target\n") && unit.contains("\nKillSignal=SIGTERM\n"), "{unit}");
    let uninstall = postern_with(&["service", "uninstall"], Some(data.path()), None, &env);
    assert_eq!(uninstall.code, 0, "{}", uninstall.stderr);
    assert!(!config.path().join("systemd/user/postern.service").exists());
}
