//! The scenario format as a JSON Schema, generated from the config types themselves so that it
//! cannot drift from what the loader accepts. `docs/schemas/scenario.schema.json` is this output;
//! a test holds the two equal and checks every shipped scenario against it.
//!
//! The schema describes structure (fields, types, variants, which fields may be left out). What
//! a value means (a rate above zero, a fraction at most one, a trace that exists) is the
//! loader's check, which every error names by file, line:column and field.

use schemars::generate::SchemaSettings;

/// The JSON Schema (draft 2020-12) of a type, as the deserializer sees it.
fn schema_of<T: schemars::JsonSchema>(id: &str, title: &str) -> serde_json::Value {
    let generator = SchemaSettings::draft2020_12().into_generator();
    let mut schema = generator.into_root_schema_for::<T>().to_value();
    let obj = schema.as_object_mut().expect("a root schema is an object");
    obj.insert("$id".into(), id.into());
    obj.insert("title".into(), title.into());
    schema
}

/// The scenario file format (`cancelsim run FILE`), RON or JSON.
pub fn scenario_schema() -> serde_json::Value {
    schema_of::<super::Scenario>(
        "https://cancelsim.dev/schemas/scenario.schema.json",
        "cancelsim scenario",
    )
}
