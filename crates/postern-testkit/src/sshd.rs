//! A real OpenSSH server on loopback for the SSH channel's tests: its own config, host key and
//! authorized keys, running as the current user; and the client keys the tests import.

use std::{
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

#[derive(Debug)]
pub struct Sshd {
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub account: String,
    child: Child,
}

/// A client key pair made with `ssh-keygen`.
pub struct ClientKey {
    pub private: String,
    pub passphrase: Option<String>,
}

impl std::fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientKey").field("passphrase", &self.passphrase.is_some()).finish_non_exhaustive()
    }
}

fn keygen(dir: &Path, name: &str, kind: &[&str], passphrase: &str) -> PathBuf {
    let path = dir.join(name);
    let ok = Command::new("ssh-keygen")
        .args(kind)
        .args(["-q", "-N", passphrase, "-C", name, "-f"])
        .arg(&path)
        .status()
        .expect("ssh-keygen (apt install openssh-client)");
    assert!(ok.success());
    path
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Sshd {
    /// Starts `sshd` with a fresh ed25519 host key and authorized keys for: an ed25519 key, an
    /// ECDSA key, an RSA key and a passphrase-protected ed25519 key (see [`Sshd::key`]).
    pub fn start() -> Sshd {
        Self::start_with_host_key(None)
    }

    /// Like [`Sshd::start`], reusing a host key file (to restart "the same host") or making one.
    /// A fresh server (new host key) on a given port: "the host was re-installed".
    pub fn start_on(port: u16) -> Sshd {
        Self::start_inner(None, Some(port))
    }

    pub fn start_with_host_key(host_key: Option<&Path>) -> Sshd {
        Self::start_inner(host_key, None)
    }

    fn start_inner(host_key: Option<&Path>, port: Option<u16>) -> Sshd {
        let sshd = ["/usr/sbin/sshd", "/usr/bin/sshd"].into_iter().find(|p| Path::new(p).exists());
        let sshd = sshd.expect("OpenSSH's sshd is not installed (apt install openssh-server; .ci/run does)");
        // sshd insists on its privilege-separation directory even when it runs unprivileged.
        let _ = std::fs::create_dir_all("/run/sshd");
        let dir = tempfile::tempdir().unwrap();
        let host = match host_key {
            Some(path) => {
                std::fs::copy(path, dir.path().join("host_ed25519")).unwrap();
                let mut perms = std::fs::metadata(dir.path().join("host_ed25519")).unwrap().permissions();
                std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
                std::fs::set_permissions(dir.path().join("host_ed25519"), perms).unwrap();
                dir.path().join("host_ed25519")
            }
            None => keygen(dir.path(), "host_ed25519", &["-t", "ed25519"], ""),
        };
        keygen(dir.path(), "id_ed25519", &["-t", "ed25519"], "");
        keygen(dir.path(), "id_ecdsa", &["-t", "ecdsa", "-b", "256"], "");
        keygen(dir.path(), "id_rsa", &["-t", "rsa", "-b", "2048"], "");
        keygen(dir.path(), "id_locked", &["-t", "ed25519"], "correct horse battery");
        let authorized: String = ["id_ed25519", "id_ecdsa", "id_rsa", "id_locked"]
            .iter()
            .map(|k| std::fs::read_to_string(dir.path().join(format!("{k}.pub"))).unwrap())
            .collect();
        std::fs::write(dir.path().join("authorized_keys"), authorized).unwrap();
        let port = port.unwrap_or_else(free_port);
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {host}\nAuthorizedKeysFile {dir}/authorized_keys\n\
             PidFile {dir}/sshd.pid\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nLogLevel ERROR\n\
             MaxStartups 100\nMaxSessions 100\n",
            host = host.display(),
            dir = dir.path().display(),
        );
        std::fs::write(dir.path().join("sshd_config"), config).unwrap();
        let child = Command::new(sshd)
            .args(["-D", "-e", "-f"])
            .arg(dir.path().join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let account =
            String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout).unwrap().trim().to_owned();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "sshd did not start listening on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Sshd { dir, port, account, child }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn host_key_file(&self) -> PathBuf {
        self.dir.path().join("host_ed25519")
    }

    /// The server's public host key line (`ssh-ed25519 AAAA… host_ed25519`).
    pub fn host_key(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("host_ed25519.pub")).unwrap().trim().to_owned()
    }

    /// `id_ed25519`, `id_ecdsa`, `id_rsa` or `id_locked` (passphrase-protected).
    pub fn key(&self, name: &str) -> ClientKey {
        ClientKey {
            private: std::fs::read_to_string(self.dir.path().join(name)).unwrap(),
            passphrase: (name == "id_locked").then(|| "correct horse battery".to_owned()),
        }
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
