//! `cancelsim schema`: the input formats as JSON Schemas (draft 2020-12), for an editor's
//! completion and for a CI step that validates files before running them. The installed binary
//! carries them, so nothing outside it is needed.

use super::Outcome;

/// Which format.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Which {
    /// Scenario files (`cancelsim run`, `check`, a sweep's base), written as RON or JSON.
    Scenario,
    /// The op log `cancelsim replay` reads, one JSON object per line.
    Oplog,
}

/// The op-log schema, written by hand beside the replayer (a test holds the two together).
const OPLOG_SCHEMA: &str = include_str!("../../../docs/schemas/oplog.schema.json");

/// Print the schema on standard output.
pub fn schema(which: Which) -> Outcome {
    match which {
        Which::Scenario => {
            let schema = cancelsim::scenario::scenario_schema();
            say!(
                "{}",
                serde_json::to_string_pretty(&schema).expect("a JSON value serialises")
            );
        }
        Which::Oplog => say_part!("{OPLOG_SCHEMA}"),
    }
    Ok(())
}
