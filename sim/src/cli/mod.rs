//! The commands of the `cancelsim` binary, one file each; `main.rs` is only the clap grammar.
//! This module holds what they share: the exit codes and standard output.

/// `println!` through `write_out`.
macro_rules! say {
    () => { $crate::cli::write_out(format_args!("\n")) };
    ($($t:tt)*) => { $crate::cli::write_out(format_args!("{}\n", format_args!($($t)*))) };
}

/// `print!` through `write_out`.
macro_rules! say_part {
    ($($t:tt)*) => { $crate::cli::write_out(format_args!($($t)*)) };
}

pub mod capacity;
pub mod cases;
pub mod check;
pub mod diff;
pub mod profiles;
pub mod replay;
pub mod run;
pub mod schema;
pub mod sweep;

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Why a command failed, which is its exit code. Success is 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// 1: the command worked and found a failure: `check` failed a scenario, or a run broke a
    /// simulator invariant.
    Found = 1,
    /// 2: bad usage or bad input (a scenario, trace, sweep or op log that is wrong, or that hits
    /// a limit). clap's usage errors exit 2 as well.
    Input = 2,
    /// 3: an output could not be written (a full disk, a closed standard output).
    Io = 3,
}

/// A failed command: its code and its one-line message.
#[derive(Debug)]
pub struct Fail {
    pub code: Code,
    pub msg: String,
}

impl Fail {
    pub fn input(msg: impl Into<String>) -> Fail {
        Fail {
            code: Code::Input,
            msg: msg.into(),
        }
    }

    pub fn io(msg: impl Into<String>) -> Fail {
        Fail {
            code: Code::Io,
            msg: msg.into(),
        }
    }
}

pub type Outcome = Result<(), Fail>;

/// The exit code of an outcome, after its message and any standard-output error are printed.
/// A standard-output error is reported even after another failure, whose code then stands.
pub fn exit(outcome: Outcome) -> ExitCode {
    let flushed = flush();
    if let (Err(_), Err(f)) = (&outcome, &flushed) {
        eprintln!("error: {}", f.msg);
    }
    match outcome.and(flushed) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            // One line, whatever a message quotes (a file name or a value with a newline).
            eprintln!("error: {}", f.msg.replace('\n', "\\n"));
            ExitCode::from(f.code as u8)
        }
    }
}

/// Standard output was closed by its reader (`| head`): later lines are dropped quietly, and the
/// command goes on, so its exit code still says what it found.
static CLOSED: AtomicBool = AtomicBool::new(false);
/// The first write error on standard output other than a closed pipe.
static BROKEN: Mutex<Option<String>> = Mutex::new(None);

/// Write to standard output; a closed pipe silences the rest, another error is kept for `exit`.
pub fn write_out(args: std::fmt::Arguments) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let result = std::io::stdout().lock().write_fmt(args);
    if let Err(e) = result {
        note(e);
    }
}

fn note(e: std::io::Error) {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        CLOSED.store(true, Ordering::Relaxed);
        return;
    }
    let mut broken = BROKEN.lock().unwrap_or_else(|p| p.into_inner());
    broken.get_or_insert_with(|| e.to_string());
    CLOSED.store(true, Ordering::Relaxed);
}

/// Flush standard output; the first error kept, if any, is the command's failure.
pub fn flush() -> Outcome {
    if !CLOSED.load(Ordering::Relaxed) {
        if let Err(e) = std::io::stdout().lock().flush() {
            note(e);
        }
    }
    let broken = BROKEN.lock().unwrap_or_else(|p| p.into_inner()).take();
    match broken {
        Some(e) => Err(Fail::io(format!("cannot write to standard output: {e}"))),
        None => Ok(()),
    }
}

/// Whether standard output was closed when the process started (`>&-`). The Rust runtime then
/// opens `/dev/null` read-write in its place, so the output would vanish without an error; a
/// shell's `> /dev/null` opens it write-only, which is a choice and not an accident.
#[cfg(target_os = "linux")]
pub fn stdout_was_closed() -> bool {
    let Ok(target) = std::fs::read_link("/proc/self/fd/1") else {
        return false;
    };
    if target != std::path::Path::new("/dev/null") {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/self/fdinfo/1") else {
        return false;
    };
    info.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        .is_some_and(|flags| flags & 0o3 == 0o2)
}

#[cfg(not(target_os = "linux"))]
pub fn stdout_was_closed() -> bool {
    false
}
