//! The scenario JSON Schema against the loader: the shipped file is the generated one, every
//! shipped scenario validates and loads back from JSON to the same scenario, and on thousands of
//! mutations an independent validator (the `jsonschema` crate) and the loader agree on what is
//! well-formed.

use std::path::{Path, PathBuf};

use cancelsim::scenario::{scenario_schema, Scenario};
use serde_json::Value;

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

fn shipped_schema() -> Value {
    let text = std::fs::read_to_string(repo("docs/schemas/scenario.schema.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Every scenario file the repository ships (sweep files are another format).
fn shipped_scenarios() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in ["scenarios", "scenarios/library"] {
        for e in std::fs::read_dir(repo(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "ron") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn the_shipped_scenario_schema_is_the_generated_one() {
    assert!(
        shipped_schema() == scenario_schema(),
        "docs/schemas/scenario.schema.json is stale: \
         run `cancelsim schema scenario > docs/schemas/scenario.schema.json`"
    );
}

/// The loader's structural verdict: does the JSON deserialize (before the meaning checks)?
fn loads(v: &Value) -> bool {
    serde_json::from_value::<Scenario>(v.clone()).is_ok()
}

#[test]
fn every_shipped_scenario_validates_and_loads_back_from_json() {
    let validator = jsonschema::draft202012::new(&shipped_schema()).unwrap();
    let files = shipped_scenarios();
    assert!(files.len() >= 40, "{} scenario files", files.len());
    for f in &files {
        let ron = Scenario::load(f).unwrap_or_else(|e| panic!("{e}"));
        let json = serde_json::to_value(&ron).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&json)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{}: {errors:?}", f.display());
        let text = serde_json::to_string_pretty(&json).unwrap();
        let mut back = Scenario::parse_json(&text, "back.json").unwrap_or_else(|e| panic!("{e}"));
        back.base_dir = ron.base_dir.clone();
        assert_eq!(back, ron, "{}", f.display());
        assert_eq!(back.hash(), ron.hash());
    }
}

/// Every way to break one node of `v`: drop a key, add a stray key, give a value of another
/// type. Each comes with a label for the failure message.
fn mutations(v: &Value, at: &str, out: &mut Vec<(String, Value)>) {
    let wrong = match v {
        Value::String(_) => Value::from(7),
        Value::Number(_) => Value::from("seven"),
        Value::Bool(_) => Value::from("yes"),
        Value::Array(_) | Value::Object(_) => Value::from(7),
        Value::Null => Value::from(false),
    };
    out.push((format!("{at} = {wrong}"), wrong));
    match v {
        Value::Object(map) => {
            let mut stray = map.clone();
            stray.insert("stray".into(), Value::from(1));
            out.push((format!("{at} + stray"), Value::Object(stray)));
            for (k, x) in map {
                let mut less = map.clone();
                less.remove(k);
                out.push((format!("{at} - {k}"), Value::Object(less)));
                let mut inner = Vec::new();
                mutations(x, &format!("{at}.{k}"), &mut inner);
                for (label, m) in inner {
                    let mut whole = map.clone();
                    whole.insert(k.clone(), m);
                    out.push((label, Value::Object(whole)));
                }
            }
        }
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                let mut inner = Vec::new();
                mutations(x, &format!("{at}[{i}]"), &mut inner);
                for (label, m) in inner {
                    let mut whole = items.clone();
                    whole[i] = m;
                    out.push((label, Value::Array(whole)));
                }
            }
        }
        _ => {}
    }
}

/// The schema is neither looser nor stricter than the loader: on every mutation of every
/// shipped scenario, both accept or both refuse. Both do refuse thousands (the mutations bite),
/// and accept some (dropped optional fields).
#[test]
fn the_schema_and_the_loader_agree_on_every_mutation() {
    let validator = jsonschema::draft202012::new(&shipped_schema()).unwrap();
    let (mut refused, mut accepted) = (0u32, 0u32);
    for f in shipped_scenarios() {
        let json = serde_json::to_value(Scenario::load(&f).unwrap()).unwrap();
        let mut all = Vec::new();
        mutations(&json, "", &mut all);
        for (label, m) in all {
            let (schema_ok, loader_ok) = (validator.is_valid(&m), loads(&m));
            assert_eq!(
                schema_ok,
                loader_ok,
                "{}: {label}: the schema says {schema_ok}, the loader {loader_ok}",
                f.display()
            );
            if loader_ok {
                accepted += 1;
            } else {
                refused += 1;
            }
        }
    }
    assert!(
        refused > 5_000 && accepted > 500,
        "{refused} refused, {accepted} accepted"
    );
}

/// A JSON scenario file runs like its RON twin; `"$schema"` and a byte-order mark are allowed;
/// a bad one gets the one-line error with the file, `line:column` and the field.
#[test]
fn json_scenario_files_load_with_located_errors() {
    let dir = crate::scratch::Scratch::new("schema", "json", true);
    let ron = Scenario::default_embedded();
    let mut json = serde_json::to_value(&ron).unwrap();
    json.as_object_mut().unwrap().insert(
        "$schema".into(),
        "https://cancelsim.dev/schemas/scenario.schema.json".into(),
    );
    let good = dir.join("good.json");
    std::fs::write(&good, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    let loaded = Scenario::load(&good).unwrap();
    assert_eq!(loaded.hash(), ron.hash());
    // With a byte-order mark, as some editors write, in either syntax.
    let bom = dir.join("bom.json");
    let text = serde_json::to_string_pretty(&json).unwrap();
    std::fs::write(&bom, format!("\u{feff}{text}")).unwrap();
    assert_eq!(Scenario::load(&bom).unwrap().hash(), ron.hash());
    let bom = dir.join("bom.ron");
    let text = cancelsim::scenario::DEFAULT_SCENARIO;
    std::fs::write(&bom, format!("\u{feff}{text}")).unwrap();
    assert_eq!(Scenario::load(&bom).unwrap().hash(), ron.hash());

    json["workload"]["source"]["Poisson"]["rate_per_s"] = Value::from(-5.0);
    let bad = dir.join("bad.json");
    let text = serde_json::to_string_pretty(&json).unwrap();
    std::fs::write(&bad, &text).unwrap();
    let err = Scenario::load(&bad).unwrap_err().0;
    let line = 1 + text[..text.find("\"rate_per_s\"").unwrap()]
        .matches('\n')
        .count();
    assert!(
        err.contains(&format!("bad.json:{line}:"))
            && err.contains("field `workload.source.Poisson.rate_per_s`"),
        "{err}"
    );

    json["workload"]["source"]["Poisson"]["rate_per_s"] = Value::from("fast");
    std::fs::write(&bad, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    let err = Scenario::load(&bad).unwrap_err().0;
    assert!(
        err.contains("bad.json:") && err.contains("(field `workload.source.Poisson.rate_per_s`)"),
        "{err}"
    );
    assert!(!err.contains(" at line "), "{err}");
}

/// serde would read named fields from a JSON list by position; the loader refuses it, with the
/// field and its line, as the schema does.
#[test]
fn a_json_list_where_named_fields_belong_is_refused() {
    let dir = crate::scratch::Scratch::new("schema", "positional", true);
    let mut json = serde_json::to_value(Scenario::default_embedded()).unwrap();
    let field = &mut json["workload"]["prompt_tokens"];
    let Value::Object(tagged) = field.clone() else {
        panic!("the default prompt is a tagged distribution: {field}")
    };
    let Some(Value::Object(named)) = tagged.get("LogNormal") else {
        panic!("the default prompt is LogNormal: {field}")
    };
    // In declaration order, so serde alone would take it: median, then sigma.
    let list = Value::from(vec![named["median"].clone(), named["sigma"].clone()]);
    let alone = serde_json::json!({"LogNormal": list.clone()}).to_string();
    let read = serde_json::from_str::<cancelsim::dist::Dist>(&alone);
    assert!(read.is_ok(), "serde reads {alone} by position: {read:?}");
    *field = serde_json::json!({"LogNormal": list});
    let validator = jsonschema::draft202012::new(&shipped_schema()).unwrap();
    assert!(!validator.is_valid(&json), "the schema refuses the list");
    let text = serde_json::to_string_pretty(&json).unwrap();
    let path = dir.join("positional.json");
    std::fs::write(&path, &text).unwrap();
    let err = Scenario::load(&path).unwrap_err().0;
    let prompt = text.find("\"prompt_tokens\"").unwrap();
    let at = prompt + text[prompt..].find("\"LogNormal\"").unwrap();
    let line = 1 + text[..at].matches('\n').count();
    assert!(
        err.starts_with(&format!("{}:{line}:", path.display()))
            && err.contains("field `workload.prompt_tokens.LogNormal`")
            && err.contains("a list where named fields belong")
            && !err.contains('\n'),
        "{err}"
    );
    // A list of the wrong length gets the same line, not serde's count of elements.
    let short = format!("{}{}", &text[..at], text[at..].replacen("1000.0,", "", 1));
    assert_ne!(short, text);
    std::fs::write(&path, &short).unwrap();
    let err = Scenario::load(&path).unwrap_err().0;
    assert!(
        err.starts_with(&format!("{}:{line}:", path.display()))
            && err.contains("field `workload.prompt_tokens.LogNormal`: a list where named")
            && !err.contains("elements"),
        "{err}"
    );
}

/// The docs' whole scenarios (the README's and every page of `docs/`), RON and JSON, load; the
/// JSON ones validate.
#[test]
fn the_readme_scenarios_load_and_its_json_validates() {
    let mut readme = std::fs::read_to_string(repo("README.md")).unwrap();
    let mut pages: Vec<_> = std::fs::read_dir(repo("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    for page in pages {
        readme += &std::fs::read_to_string(page).unwrap();
    }
    let validator = jsonschema::draft202012::new(&shipped_schema()).unwrap();
    let (mut ron, mut json) = (0, 0);
    for block in readme.split("```").skip(1).step_by(2) {
        if let Some(body) = block.strip_prefix("ron\n") {
            if body.starts_with("Scenario(") {
                Scenario::parse(body, "README.md").unwrap_or_else(|e| panic!("{e}"));
                ron += 1;
            }
        } else if let Some(body) = block.strip_prefix("json\n") {
            if body.contains("\"$schema\"") {
                Scenario::parse_json(body, "README.md").unwrap_or_else(|e| panic!("{e}"));
                let v: Value = serde_json::from_str(body).unwrap();
                assert!(validator.is_valid(&v), "{body}");
                json += 1;
            }
        }
    }
    assert!(
        ron >= 1 && json >= 1,
        "{ron} RON and {json} JSON scenarios in the docs"
    );
}

/// The fuzzer's scenarios reach every option, far beyond the shipped files: each validates
/// against the schema and comes back from JSON as the same scenario, hash and all.
#[test]
fn fuzzed_scenarios_validate_and_round_trip_through_json() {
    use cancelsim::check::fuzz::{scenario, Tier};
    let validator = jsonschema::draft202012::new(&shipped_schema()).unwrap();
    let base = repo("scenarios");
    for seed in 1..=400 {
        let tier = if seed % 10 == 0 {
            Tier::Big
        } else {
            Tier::Small
        };
        let s = scenario(seed, tier, base.clone());
        let json = serde_json::to_value(&s).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&json)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "fuzz seed {seed}: {errors:?}");
        let text = serde_json::to_string(&json).unwrap();
        let mut back = Scenario::parse_json(&text, "fuzz.json")
            .unwrap_or_else(|e| panic!("fuzz seed {seed}: {e}"));
        back.base_dir = s.base_dir.clone();
        assert_eq!(back, s, "fuzz seed {seed}");
        assert_eq!(back.hash(), s.hash());
    }
}
