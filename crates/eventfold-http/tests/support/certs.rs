//! Test certificates made at test time with the `openssl` command: a CA, and a server
//! certificate it signs for `localhost` and `127.0.0.1`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The files of one generated CA and server certificate.
#[allow(dead_code)] // Each test crate uses its own part.
pub struct Certs {
    /// The CA's certificate (PEM): what a client trusts.
    pub ca: PathBuf,
    /// The server's certificate (PEM), signed by the CA.
    pub cert: PathBuf,
    /// The server's private key (PEM, PKCS#8).
    pub key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command runs (apt-get install -y openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA named `name` and a server certificate it signs, in `dir`.
pub fn generate(dir: &Path, name: &str) -> Certs {
    let p = |f: &str| dir.join(format!("{name}-{f}"));
    let (ca_key, ca, key, csr, cert, ext) = (
        p("ca.key"),
        p("ca.pem"),
        p("key.pem"),
        p("csr.pem"),
        p("cert.pem"),
        p("ext.cnf"),
    );
    let s = |p: &PathBuf| p.to_str().unwrap().to_owned();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    let subject = format!("/CN={name} test CA");
    let mut args = vec!["req", "-x509", "-days", "2", "-subj", &subject];
    args.extend(ec);
    let (ca_key_s, ca_s) = (s(&ca_key), s(&ca));
    args.extend(["-keyout", &ca_key_s, "-out", &ca_s]);
    args.extend([
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(dir, &args);
    let (key_s, csr_s) = (s(&key), s(&csr));
    let mut args = vec!["req", "-subj", "/CN=localhost", "-keyout", &key_s, "-out", &csr_s];
    args.extend(ec);
    openssl(dir, &args);
    std::fs::write(
        &ext,
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let (ext_s, cert_s) = (s(&ext), s(&cert));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            &csr_s,
            "-CA",
            &ca_s,
            "-CAkey",
            &ca_key_s,
            "-CAcreateserial",
            "-extfile",
            &ext_s,
            "-out",
            &cert_s,
        ],
    );
    Certs { ca, cert, key }
}
