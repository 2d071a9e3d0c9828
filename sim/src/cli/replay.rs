//! `cancelsim replay`: an op log through the ownership controller.

use std::process::ExitCode;

/// Exit 0 when every line was processed (a rejected op is a result), 2 when the input cannot be
/// read.
pub fn replay(file: &std::path::Path) -> ExitCode {
    let stdout = std::io::stdout().lock();
    let out = std::io::BufWriter::new(stdout);
    let result = if file.as_os_str() == "-" {
        cancelsim::replay::replay(std::io::stdin().lock(), out)
    } else {
        match std::fs::File::open(file) {
            Ok(f) => cancelsim::replay::replay(std::io::BufReader::new(f), out),
            Err(e) => {
                eprintln!("error: {}: cannot read op log: {e}", file.display());
                return ExitCode::from(2);
            }
        }
    };
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}: {e}", file.display());
            ExitCode::from(2)
        }
    }
}
