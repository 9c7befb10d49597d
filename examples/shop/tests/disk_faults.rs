//! Faults of the disk under the embedded log (issue 56, point 7): a data directory on a
//! small filesystem that fills up (ENOSPC), and an fsync that fails (EIO, injected with an
//! `LD_PRELOAD` shim around `fsync`/`fdatasync`).
//!
//! Both check the same contract from outside, through HTTP: once a write fails the service
//! stops acknowledging (fail-stop: no 200 after the first failure), says why (the error
//! body, `/readyz`, its log), and a restart with a healthy disk recovers every command it
//! acknowledged, then takes commands again.
//!
//! The ENOSPC test mounts a tmpfs of its own, which needs root (CI runs as root); without
//! it the test fails and says so rather than skip.

mod common;

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Commands sent after the first failed one; none of them may be acknowledged.
const AFTER_FAILURE: usize = 20;
/// Commands acknowledged before the fault.
const BEFORE: usize = 30;

/// A shop process with its stderr in a file (killed and reaped on drop).
struct Service {
    _shop: common::Shop,
    url: String,
    log: PathBuf,
}

/// Starts the shop on `data` with `env`, and waits for `/readyz` 200.
fn start(data: &Path, log: &Path, env: &[(&str, &str)]) -> Service {
    let args = ["--data-dir", data.to_str().unwrap(), "--partitions", "2"];
    let (shop, url) = common::start_logged(&args, env, log, Duration::from_secs(60));
    Service {
        _shop: shop,
        url,
        log: log.to_owned(),
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn place(url: &str, id: &str) -> (u16, serde_json::Value) {
    let body = r#"{"type":"PlaceOrder","customer_id":"c-1","items":[{"sku":"sku-1","qty":1,"price_cents":100}]}"#;
    common::post(
        url,
        &format!("/v1/aggregates/order/{id}/commands"),
        body,
        &format!("k-{id}"),
    )
}

/// Places orders `prefix-0..` until one is not acknowledged (at most `max`), then
/// `AFTER_FAILURE` more; returns the acknowledged ids and the first failure's answer.
/// Fails the test if a command after the first failure is acknowledged.
fn place_until_failure(url: &str, prefix: &str, max: usize) -> (Vec<String>, (u16, serde_json::Value)) {
    let mut acked = Vec::new();
    for i in 0..max {
        let id = format!("{prefix}-{i}");
        let (status, body) = place(url, &id);
        if status == 200 {
            acked.push(id);
            continue;
        }
        for j in 0..AFTER_FAILURE {
            let id = format!("{prefix}-after-{j}");
            let (s, b) = place(url, &id);
            assert_ne!(s, 200, "{id} acknowledged after a failed write (fail-stop): {b}");
        }
        return (acked, (status, body));
    }
    panic!("{max} commands all acknowledged: the fault never showed");
}

/// Every acknowledged order is there after the restart, with the event it was answered with.
fn check_recovered(url: &str, acked: &[String]) {
    for id in acked {
        let (status, state) = common::get(url, &format!("/v1/aggregates/order/{id}"));
        assert_eq!(status, 200, "acknowledged order {id} lost: {state}");
        assert_eq!(state["version"], 1, "{id}: {state}");
    }
    let (status, body) = place(url, "after-restart");
    assert_eq!(status, 200, "the restarted service takes commands: {body}");
}

/// The service says why it stopped: the failed command's body, `/readyz` and its log.
fn check_reported(svc: &Service, failure: &(u16, serde_json::Value), why: &[&str]) {
    let (status, body) = failure;
    eprintln!("the first refused command: {status} {body}");
    assert!(*status >= 500, "a failed write answers 5xx, got {status}: {body}");
    assert!(body["error"].is_string() && body["message"].is_string(), "{body}");
    let (ready, readyz) = common::get(&svc.url, "/readyz");
    assert_eq!(ready, 503, "/readyz after a failed write: {readyz}");
    let log = read(&svc.log);
    assert!(
        why.iter().any(|w| log.contains(w)),
        "the log names the cause (one of {why:?}):\n{log}"
    );
}

/// Unmounts on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Self {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                at.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mounting a {size} tmpfs at {} needs root (CI runs as root): {}",
            at.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Self(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the filesystem of `dir` with one file; returns its path.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = File::create(&path).unwrap();
    for chunk in [1 << 20, 4096, 1] {
        let buf = vec![0u8; chunk];
        while f.write_all(&buf).and_then(|_| f.flush()).is_ok() {}
    }
    path
}

#[test]
fn a_full_disk_stops_acknowledgements_and_a_restart_with_space_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = Tmpfs::mount(&tmp.path().join("mnt"), "64m");
    let data = mnt.0.join("data");
    let log = tmp.path().join("shop.log");
    let svc = start(&data, &log, &[]);
    let mut acked = Vec::new();
    for i in 0..BEFORE {
        let id = format!("before-{i}");
        assert_eq!(place(&svc.url, &id).0, 200);
        acked.push(id);
    }
    let filler = fill(&mnt.0);
    let (more, failure) = place_until_failure(&svc.url, "full", 5_000);
    acked.extend(more);
    check_reported(&svc, &failure, &["No space left on device", "os error 28"]);
    drop(svc);

    std::fs::remove_file(filler).unwrap();
    let svc = start(&data, &tmp.path().join("restart.log"), &[]);
    check_recovered(&svc.url, &acked);
}

/// An `LD_PRELOAD` shim: `fsync` and `fdatasync` fail with EIO once the file named by
/// `FAILSYNC_TRIGGER` exists.
const SHIM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
static int tripped(void) {
    const char *t = getenv("FAILSYNC_TRIGGER");
    return t && access(t, F_OK) == 0;
}
int fsync(int fd) {
    if (tripped()) { errno = EIO; return -1; }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}
int fdatasync(int fd) {
    if (tripped()) { errno = EIO; return -1; }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}
"#;

fn build_shim(dir: &Path) -> PathBuf {
    let src = dir.join("failsync.c");
    let lib = dir.join("libfailsync.so");
    std::fs::write(&src, SHIM).unwrap();
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("a C compiler (cc) builds the fsync shim");
    assert!(out.status.success(), "cc: {}", String::from_utf8_lossy(&out.stderr));
    lib
}

#[test]
fn a_failed_fsync_stops_acknowledgements_and_a_restart_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let shim = build_shim(tmp.path());
    let trigger = tmp.path().join("fail-fsync-now");
    let data = tmp.path().join("data");
    let svc = start(
        &data,
        &tmp.path().join("shop.log"),
        &[
            ("LD_PRELOAD", shim.to_str().unwrap()),
            ("FAILSYNC_TRIGGER", trigger.to_str().unwrap()),
        ],
    );
    let mut acked = Vec::new();
    for i in 0..BEFORE {
        let id = format!("before-{i}");
        assert_eq!(place(&svc.url, &id).0, 200);
        acked.push(id);
    }
    File::create(&trigger).unwrap();
    let (more, failure) = place_until_failure(&svc.url, "nosync", 100);
    assert!(more.is_empty(), "acknowledged without a successful fsync: {more:?}");
    check_reported(&svc, &failure, &["Input/output error", "os error 5"]);
    drop(svc);

    std::fs::remove_file(&trigger).unwrap();
    let svc = start(&data, &tmp.path().join("restart.log"), &[]);
    check_recovered(&svc.url, &acked);
}
