//! TLS for the TLS tests: a certificate authority generated per test, a
//! server certificate it signs for `localhost` and `127.0.0.1`, a second
//! authority nobody trusts (for the refusals), and database servers of the
//! test's own that accept only TLS: a Postgres cluster (`hostssl` only)
//! and a MariaDB server (`require_secure_transport`) under a temp
//! directory, on free ports. (Redis: [`crate::redis_server::RedisServer::start_tls`].)
//!
//! It must not touch the machine's shared servers: each server here is
//! started, owned and killed by one test.

use crate::{TempDir, free_port};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A test's certificates, as PEM files in its own directory.
pub struct Authority {
    dir: TempDir,
    /// The authority's certificate: what a client trusts.
    pub ca: PathBuf,
    /// The server's certificate (signed by `ca`) and its private key.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Another authority's certificate: trusting it, a client must refuse
    /// the server.
    pub rogue_ca: PathBuf,
}

impl Authority {
    pub fn generate(name: &str) -> Authority {
        let dir = TempDir::new(&format!("tls-{name}"));
        let (ca_cert, ca_key) = authority("sluice test CA");
        let (rogue, _) = authority("somebody else's CA");
        let key = KeyPair::generate().expect("server key");
        let mut params = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
            .expect("server names");
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let cert = params
            .signed_by(&key, &ca_cert, &ca_key)
            .expect("sign the server certificate");
        let write = |file: &str, pem: String| {
            let path = dir.path().join(file);
            std::fs::write(&path, pem).expect("write a PEM file");
            path
        };
        Authority {
            ca: write("ca.pem", ca_cert.pem()),
            cert: write("server.pem", cert.pem()),
            key: write("server.key", key.serialize_pem()),
            rogue_ca: write("rogue-ca.pem", rogue.pem()),
            dir,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A self-signed certificate authority and its key.
fn authority(name: &str) -> (rcgen::Certificate, KeyPair) {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key).expect("self-sign the CA");
    (cert, key)
}

/// A Postgres cluster of one test accepting only TLS connections
/// (`pg_hba.conf`: `hostssl` trust, everything else rejected); stopped
/// (immediate) when dropped.
pub struct TlsPostgres {
    pub port: u16,
    dir: TempDir,
    bin: PathBuf,
}

impl TlsPostgres {
    /// Creates and starts the cluster with `tls`'s server certificate.
    /// Postgres refuses to run as root: as root, it runs as `postgres`.
    pub fn start(name: &str, tls: &Authority) -> TlsPostgres {
        let bin = postgres_bin();
        let dir = TempDir::new(&format!("pg-{name}"));
        let data = dir.path().join("data");
        let (cert, key) = (dir.path().join("server.pem"), dir.path().join("server.key"));
        std::fs::copy(&tls.cert, &cert).expect("copy the certificate");
        std::fs::copy(&tls.key, &key).expect("copy the key");
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod the key");
        as_postgres_owner(dir.path());
        run_as_postgres(
            Command::new(bin.join("initdb")).arg("-D").arg(&data).args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ]),
            "initdb",
        );
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhost all all 0.0.0.0/0 reject\n",
        )
        .expect("write pg_hba.conf");
        let port = free_port();
        let options = format!(
            "-p {port} -k {dir} -c listen_addresses=127.0.0.1 -c ssl=on -c ssl_cert_file={cert} \
             -c ssl_key_file={key} -c fsync=off -c full_page_writes=off",
            dir = dir.path().display(),
            cert = cert.display(),
            key = key.display(),
        );
        run_as_postgres(
            Command::new(bin.join("pg_ctl"))
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(dir.path().join("log"))
                .args(["-w", "-o", &options, "start"]),
            "pg_ctl start",
        );
        TlsPostgres { port, dir, bin }
    }

    /// A URL of database `postgres` verifying the server against `ca`.
    pub fn url(&self, ca: &Path) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}",
            self.port,
            ca.display()
        )
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        let mut stop = Command::new(self.bin.join("pg_ctl"));
        stop.arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "stop"]);
        let _ = as_postgres(&mut stop).stdout(Stdio::null()).status();
    }
}

/// The newest installed Postgres's `bin` directory (Debian's layout).
fn postgres_bin() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("Postgres server binaries under /usr/lib/postgresql (Debian package postgresql)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop().expect("an initdb under /usr/lib/postgresql")
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Hands `dir` (and what is in it) to the `postgres` user when root.
fn as_postgres_owner(dir: &Path) {
    if is_root() {
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir)
            .status()
            .expect("chown");
        assert!(status.success(), "chown {}", dir.display());
    }
}

/// `command` as the `postgres` user when root (through `runuser`).
fn as_postgres(command: &mut Command) -> Command {
    if !is_root() {
        let mut same = Command::new(command.get_program());
        same.args(command.get_args());
        return same;
    }
    let mut wrapped = Command::new("runuser");
    wrapped
        .args(["-u", "postgres", "--"])
        .arg(command.get_program())
        .args(command.get_args());
    wrapped
}

fn run_as_postgres(command: &mut Command, what: &str) {
    let out = as_postgres(command).output().expect(what);
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A MariaDB server of one test accepting only TLS connections
/// (`require_secure_transport`), database `test` created; killed when
/// dropped.
pub struct TlsMariadb {
    pub port: u16,
    _dir: TempDir,
    child: Child,
}

impl TlsMariadb {
    pub fn start(name: &str, tls: &Authority) -> TlsMariadb {
        let dir = TempDir::new(&format!("my-{name}"));
        let data = dir.path().join("data");
        let out = Command::new("mariadb-install-db")
            .args(["--no-defaults", "--user=root", "--skip-test-db"])
            .args(["--auth-root-authentication-method=normal"])
            .arg(format!("--datadir={}", data.display()))
            .output()
            .expect("mariadb-install-db (Debian package mariadb-server)");
        assert!(
            out.status.success(),
            "mariadb-install-db: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let socket = dir.path().join("sock");
        let child = Command::new("mariadbd")
            .args(["--no-defaults", "--user=root", "--bind-address=127.0.0.1"])
            .arg(format!("--port={port}"))
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", dir.path().join("pid").display()))
            .arg(format!("--ssl-cert={}", tls.cert.display()))
            .arg(format!("--ssl-key={}", tls.key.display()))
            .args(["--require-secure-transport=ON", "--skip-log-bin"])
            .args(["--innodb-flush-log-at-trx-commit=0", "--skip-name-resolve"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mariadbd");
        let server = TlsMariadb {
            port,
            _dir: dir,
            child,
        };
        server.create_test_database(&socket);
        server
    }

    /// Waits for the server's socket, then creates database `test`.
    fn create_test_database(&self, socket: &Path) {
        let started = Instant::now();
        loop {
            let out = Command::new("mariadb")
                .arg(format!("--socket={}", socket.display()))
                .args(["-uroot", "-e", "CREATE DATABASE IF NOT EXISTS test"])
                .output()
                .expect("the mariadb client");
            if out.status.success() {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "mariadbd did not answer: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A URL of database `test` verifying the server against `ca`.
    pub fn url(&self, ca: &Path) -> String {
        format!(
            "mysql://root@127.0.0.1:{}/test?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
            self.port,
            ca.display()
        )
    }
}

impl Drop for TlsMariadb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Kafka broker reached only through TLS: the broker listens in plain
/// text on a port of its own and advertises the port of a TLS proxy
/// (`socat OPENSSL-LISTEN`, with `tls`'s server certificate) that
/// forwards to it, so every client following the broker's metadata speaks
/// TLS. (The local broker takes `--cert`/`--key` but its build does not
/// serve TLS.) Both are killed when dropped.
pub struct TlsBroker {
    /// Where clients connect: the TLS port.
    pub brokers: String,
    /// The plain listener, for raw protocol reads that follow no metadata
    /// (`markers::read_committed_by_markers`).
    pub plain: String,
    _broker: crate::Broker,
    proxy: Child,
}

impl TlsBroker {
    pub fn start(tls: &Authority) -> TlsBroker {
        let port = free_port();
        let broker = crate::Broker::start_behind(port);
        let proxy = Command::new("socat")
            .arg(format!(
                "OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,verify=0,cert={},key={}",
                tls.cert.display(),
                tls.key.display()
            ))
            .arg(format!("TCP:{}", broker.brokers))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start socat (Debian package socat)");
        let brokers = format!("127.0.0.1:{port}");
        crate::wait_for_port(&brokers, "socat");
        TlsBroker {
            plain: broker.brokers.clone(),
            brokers,
            _broker: broker,
            proxy,
        }
    }
}

impl Drop for TlsBroker {
    fn drop(&mut self) {
        let _ = self.proxy.kill();
        let _ = self.proxy.wait();
    }
}
