//! `cancelsim replay`: an op log through the ownership controller.

use std::path::Path;

use cancelsim::replay::ReplayError;

use super::{Fail, Outcome};

/// Every line processed is success (a rejected op is a result); an unreadable log is an input
/// error, and results that cannot be written are an I/O error naming standard output.
pub fn replay(file: &Path, expect: bool) -> Outcome {
    let stdout = std::io::stdout().lock();
    let out = std::io::BufWriter::new(stdout);
    let result = if file.as_os_str() == "-" {
        cancelsim::replay::replay_with(std::io::stdin().lock(), out, expect)
    } else {
        let f = std::fs::File::open(file)
            .map_err(|e| Fail::input(format!("{}: cannot read op log: {e}", file.display())))?;
        cancelsim::replay::replay_with(std::io::BufReader::new(f), out, expect)
    };
    match result {
        Ok(lines) => {
            if expect {
                eprintln!("replay: {lines} ops, every result as expected");
            }
            Ok(())
        }
        Err(ReplayError::Mismatch {
            line,
            op,
            expected,
            got,
        }) => Err(Fail {
            code: super::Code::Found,
            msg: format!(
                "{}:{line}: expected {expected}, got {got} (op: {op})",
                file.display()
            ),
        }),
        Err(ReplayError::Read(e)) => Err(Fail::input(format!("{}: {e}", file.display()))),
        Err(ReplayError::Write(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(ReplayError::Write(e)) => {
            Err(Fail::io(format!("cannot write to standard output: {e}")))
        }
    }
}
