//! Peak memory of a 20,000-request run that writes every output, trace.json included: under
//! 100 MB of resident memory, because the trace and requests.csv stream to disk. (The trace was
//! built in memory before, 4 GB for this run.) Linux only: it reads the child's `VmHWM`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

const RSS_KB_MAX: u64 = 100 * 1024;

/// The default scenario at 20,000 requests with one policy (two runs, each trace cut at its
/// limit).
fn scenario() -> String {
    let default = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/default.ron"),
    )
    .unwrap();
    let text = default.replace("requests: 1500", "requests: 20000");
    let start = text.find("policies: [").unwrap();
    let end = start + text[start..].find("],").unwrap() + 2;
    format!("{}policies: [PerRequest],{}", &text[..start], &text[end..])
}

/// The child's peak resident set so far, in kB.
fn hwm_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn a_20k_request_run_with_its_trace_stays_under_100_mb() {
    if !Path::new("/proc/self/status").exists() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("cancelsim-memory-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("s.ron"), scenario()).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cancelsim"))
        .args(["run", "s.ron", "--out", "out"])
        .current_dir(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut peak_kb = 0;
    let status = loop {
        // VmHWM only grows, so the last reading before exit is the run's peak, give or take
        // the last 5 ms.
        if let Some(kb) = hwm_kb(child.id()) {
            peak_kb = peak_kb.max(kb);
        }
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(status.success());
    let runs: Vec<_> = std::fs::read_dir(dir.join("out/default"))
        .unwrap()
        .collect();
    let run = runs[0].as_ref().unwrap().path();
    let trace = std::fs::metadata(run.join("trace.json")).unwrap().len();
    assert!(trace > 10 << 20, "the trace was written ({trace} bytes)");
    assert!(peak_kb > 0, "no reading of the child's memory");
    assert!(
        peak_kb < RSS_KB_MAX,
        "peak RSS {peak_kb} kB, the limit is {RSS_KB_MAX} kB"
    );
    println!("peak RSS {peak_kb} kB, trace.json {trace} bytes");
    let _ = std::fs::remove_dir_all(&dir);
}
