//! `cancelsim replay`: an op log through the ownership controller.

use std::path::Path;

use cancelsim::replay::ReplayError;

use super::{Fail, Outcome};

/// Every line processed is success (a rejected op is a result); an unreadable log is an input
/// error, and results that cannot be written are an I/O error naming standard output.
pub fn replay(file: &Path) -> Outcome {
    let stdout = std::io::stdout().lock();
    let out = std::io::BufWriter::new(stdout);
    let result = if file.as_os_str() == "-" {
        cancelsim::replay::replay(std::io::stdin().lock(), out)
    } else {
        let f = std::fs::File::open(file)
            .map_err(|e| Fail::input(format!("{}: cannot read op log: {e}", file.display())))?;
        cancelsim::replay::replay(std::io::BufReader::new(f), out)
    };
    match result {
        Ok(_) => Ok(()),
        Err(ReplayError::Read(e)) => Err(Fail::input(format!("{}: {e}", file.display()))),
        Err(ReplayError::Write(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(ReplayError::Write(e)) => {
            Err(Fail::io(format!("cannot write to standard output: {e}")))
        }
    }
}
