//! `cancelsim replay`: the committed fixture log replays to the reference's answers, and the
//! op-log rules hold (types before anything else, error lines change nothing, exit codes).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use cancelsim::replay::{replay, Replayer};

fn repo(p: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

fn replay_str(input: &str) -> Vec<String> {
    let mut out = Vec::new();
    replay(input.as_bytes(), &mut out).unwrap();
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// `scenarios/oplogs/reference.jsonl` encodes every fixture of the reference's `tests()`;
/// `reference.expected.jsonl` holds the reference's answers (checked against the reference
/// itself by `tools/reference_oracle.py`, which `.ci/run` runs).
#[test]
fn committed_fixture_log_replays_to_the_reference_answers() {
    let input = std::fs::read_to_string(repo("scenarios/oplogs/reference.jsonl")).unwrap();
    let expected =
        std::fs::read_to_string(repo("scenarios/oplogs/reference.expected.jsonl")).unwrap();
    let got = replay_str(&input);
    let expected: Vec<&str> = expected.lines().collect();
    assert_eq!(
        got.len(),
        input.lines().count(),
        "one output line per input line"
    );
    assert_eq!(got, expected);
    // And the reference's own assertions, spelled out, so the expected file cannot drift.
    let words: Vec<serde_json::Value> = got
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let word = |i: usize| {
        words[i - 1]["result"]
            .as_str()
            .unwrap_or("ERROR")
            .to_string()
    };
    assert_eq!(word(3), "accepted");
    assert_eq!(word(4), "stale");
    assert_eq!(word(9), "duplicate");
    assert_eq!(word(11), "cancelled");
    assert_eq!(words[12]["payload"], "sibling");
    for i in 16..=19 {
        assert!(
            words[i - 1].get("error").is_some(),
            "line {i} must be rejected"
        );
    }
    assert_eq!(word(22), "stale");
    assert_eq!(word(25), "cancelled");
    assert_eq!(word(29), "expired");
    assert_eq!(word(30), "expired");
    assert_eq!(word(35), "blocked");
    assert_eq!(word(37), "blocked");
    assert_eq!(word(40), "empty");
    let submitted = words.iter().filter(|w| w["result"] == "submitted").count();
    assert_eq!(submitted, 1, "len(owners.sent) == 1");
}

#[test]
fn types_are_checked_first_and_errors_are_lines() {
    let mut r = Replayer::default();
    let mut line = |s: &str| r.line(s);
    assert_eq!(
        line(r#"{"op":"start","request":"a","generation":2.0}"#),
        r#"{"error":"field `generation` must be an integer"}"#
    );
    assert_eq!(
        line(r#"{"op":"start","request":"a","generation":true}"#),
        r#"{"error":"field `generation` must be an integer"}"#
    );
    assert_eq!(
        line(r#"{"op":"start","request":"a"}"#),
        r#"{"error":"missing field `generation`"}"#
    );
    assert_eq!(
        line(r#"{"op":"start","request":"a","generation":1,"gen":1}"#),
        r#"{"error":"unknown field `gen`"}"#
    );
    assert_eq!(
        line(r#"{"op":"launch"}"#),
        r#"{"error":"unknown op \"launch\""}"#
    );
    assert_eq!(
        line(r#"{"request":"a"}"#),
        r#"{"error":"missing field `op`"}"#
    );
    assert_eq!(
        line(r#"[1,2]"#),
        r#"{"error":"an op line must be a JSON object"}"#
    );
    assert!(line("{oops").starts_with(r#"{"error":"malformed JSON"#));
    assert!(line("").starts_with(r#"{"error":"malformed JSON"#));
    // None of that created anything.
    assert_eq!(
        line(r#"{"op":"start","request":"a","generation":1}"#),
        r#"{"result":"started"}"#
    );
    // Negative generation: a valid int, rejected by the contract.
    assert_eq!(
        line(r#"{"op":"start","request":"n","generation":-1}"#),
        r#"{"error":"invalid or reused request identity"}"#
    );
    assert_eq!(
        line(r#"{"op":"update","request":"a","revision":0,"payload":"x","final":1}"#),
        r#"{"error":"field `final` must be a boolean"}"#
    );
    assert_eq!(
        line(r#"{"op":"update","request":"a","revision":-1,"payload":"x"}"#),
        r#"{"error":"invalid output evidence"}"#
    );
    assert_eq!(
        line(r#"{"op":"update","request":"zz","revision":0,"payload":"x"}"#),
        r#"{"error":"unknown request"}"#
    );
    assert_eq!(
        line(r#"{"op":"finish","request":"a","disposition":"done"}"#),
        r#"{"error":"invalid terminal disposition"}"#
    );
    // A number may be an int or a float; max_age must be >= 0.
    assert_eq!(
        line(r#"{"op":"admit","request":"a","generation":1,"born":0.5,"max_age":-1,"now":1}"#),
        r#"{"error":"invalid age inputs"}"#
    );
    assert_eq!(
        line(r#"{"op":"admit","request":"a","generation":1,"born":"0","max_age":1,"now":1}"#),
        r#"{"error":"field `born` must be a number"}"#
    );
    assert_eq!(
        line(r#"{"op":"admit","request":"a","generation":1,"born":0.5,"max_age":1,"now":1}"#),
        r#"{"result":"empty"}"#
    );
}

#[test]
fn failed_admit_end_keeps_its_ticket_and_a_ticket_is_used_once() {
    let mut r = Replayer::default();
    let mut line = |s: &str| r.line(s);
    // The request does not exist yet at begin: begin looks only at its inputs and the epoch.
    assert_eq!(
        line(
            r#"{"op":"admit_begin","ticket":"t","request":"x","generation":0,"born":10,"max_age":5}"#
        ),
        r#"{"result":"waiting"}"#
    );
    assert_eq!(
        line(r#"{"op":"admit_end","ticket":"t","now":12}"#),
        r#"{"error":"unknown request"}"#
    );
    line(r#"{"op":"start","request":"x","generation":0}"#);
    line(r#"{"op":"update","request":"x","revision":0,"payload":"héllo \"q\""}"#);
    assert_eq!(
        line(r#"{"op":"admit_end","ticket":"t","now":9}"#),
        r#"{"error":"invalid local clock"}"#
    );
    assert_eq!(
        line(r#"{"op":"admit_end","ticket":"t"}"#),
        r#"{"error":"missing field `now`"}"#
    );
    assert_eq!(
        line(r#"{"op":"admit_end","ticket":"t","now":15}"#),
        r#"{"result":"submitted","payload":"héllo \"q\""}"#
    );
    assert_eq!(
        line(r#"{"op":"admit_end","ticket":"t","now":15}"#),
        r#"{"error":"unknown ticket \"t\""}"#
    );
    assert_eq!(
        line(
            r#"{"op":"admit_begin","ticket":"t","request":"x","generation":0,"born":10,"max_age":5}"#
        ),
        r#"{"error":"ticket \"t\" already used"}"#
    );
    // A negative admission generation is legal and never matches: stale.
    assert_eq!(
        line(r#"{"op":"admit","request":"x","generation":-3,"born":0,"max_age":1,"now":0}"#),
        r#"{"result":"stale"}"#
    );
}

fn cancelsim(args: &[&str], stdin: &str) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cancelsim"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn exit_status_is_0_for_processed_logs_and_2_for_unreadable_files() {
    let input =
        "{\"op\":\"start\",\"request\":\"a\",\"generation\":1}\nnot json\n{\"op\":\"nope\"}\n";
    let (code, stdout, _) = cancelsim(&["replay", "-"], input);
    assert_eq!(code, Some(0));
    assert_eq!(stdout.lines().count(), 3);
    let (code, stdout, stderr) = cancelsim(&["replay", "/nonexistent/op.log"], "");
    assert_eq!(code, Some(2));
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("/nonexistent/op.log: cannot read op log"),
        "{stderr}"
    );
    // A directory cannot be read as a log either.
    let (code, _, _) = cancelsim(&["replay", "/"], "");
    assert_eq!(code, Some(2));
    // Not UTF-8: an error line, and processing goes on.
    let mut out = Vec::new();
    replay(&b"\xff\xfe\n{\"op\":\"barrier_advance\"}"[..], &mut out).unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "{\"error\":\"malformed JSON: line is not UTF-8\"}\n{\"result\":\"ok\"}\n"
    );
}

fn replay_expect(log: &str) -> (Option<i32>, String, String) {
    cancelsim(&["replay", "--expect", "-"], log)
}

/// The fixture with the reference's own answers as `expect` fields passes; change one answer,
/// or leave one out, and the replay stops there with exit 1, naming the line and both results.
#[test]
fn replay_expect_passes_the_reference_answers_and_stops_at_the_first_difference() {
    let log = std::fs::read_to_string(repo("scenarios/oplogs/reference.expect.jsonl")).unwrap();
    let (code, stdout, stderr) = replay_expect(&log);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.lines().count(), log.lines().count());
    assert!(
        stderr.contains("40 ops, every result as expected"),
        "{stderr}"
    );

    let lines: Vec<&str> = log.lines().collect();
    let third = lines[2].replace("\"expect\":\"accepted\"", "\"expect\":\"stale\"");
    assert_ne!(third, lines[2]);
    let wrong = [lines[0], lines[1], &third, lines[3]].join("\n");
    let (code, stdout, stderr) = replay_expect(&wrong);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        stdout.lines().count(),
        3,
        "stops after the mismatching line"
    );
    assert!(
        stderr.contains("-:3: expected \"stale\", got {\"result\":\"accepted\"}"),
        "{stderr}"
    );
    assert!(stderr.contains("\"op\":\"update\""), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");

    let bare = format!("{}\n{{\"op\":\"barrier_advance\"}}\n", lines[0]);
    let (code, _, stderr) = replay_expect(&bare);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("-:2: expected an `expect` field"),
        "{stderr}"
    );

    // Whole objects and "error" match as documented.
    let whole = "{\"op\":\"start\",\"request\":\"x\",\"generation\":1,\"expect\":{\"result\":\"started\"}}\n\
                 {\"op\":\"start\",\"request\":\"x\",\"generation\":1,\"expect\":\"error\"}\n";
    assert_eq!(replay_expect(whole).0, Some(0));
}

/// The op log shown in `docs/ci.md` gets exactly the results it says it expects.
#[test]
fn the_ci_page_example_replays_as_it_says() {
    let page = std::fs::read_to_string(repo("docs/ci.md")).unwrap();
    let start = page.find("```json\n").expect("a json block") + "```json\n".len();
    let len = page[start..].find("```").unwrap();
    let log = &page[start..start + len];
    assert_eq!(log.lines().count(), 5);
    let (code, _, stderr) = replay_expect(log);
    assert_eq!(code, Some(0), "{stderr}");
}

/// The keywords `docs/schemas/oplog.schema.json` uses, checked: enough of JSON Schema to hold
/// the replayer to the shipped schema without a validator crate.
fn valid(schema: &serde_json::Value, root: &serde_json::Value, v: &serde_json::Value) -> bool {
    use serde_json::Value;
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.trim_start_matches("#/$defs/");
        return valid(&root["$defs"][name], root, v);
    }
    if let Some(options) = schema.get("oneOf").and_then(Value::as_array) {
        return options.iter().filter(|s| valid(s, root, v)).count() == 1;
    }
    if let Some(c) = schema.get("const") {
        return v == c;
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        return e.contains(v);
    }
    let typed = match schema.get("type").and_then(Value::as_str) {
        Some("string") => v.is_string(),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        Some("object") | None => true,
        Some(_) => false,
    };
    if !typed {
        return false;
    }
    let Some(obj) = v.as_object() else {
        return schema.get("type").and_then(Value::as_str) != Some("object");
    };
    let props = schema.get("properties").and_then(Value::as_object);
    let required = schema.get("required").and_then(Value::as_array);
    let has_all = required.is_none_or(|r| r.iter().all(|k| obj.contains_key(k.as_str().unwrap())));
    let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
    has_all
        && obj.iter().all(|(k, x)| match props.and_then(|p| p.get(k)) {
            Some(s) => valid(s, root, x),
            None => !closed,
        })
}

/// The shipped op-log schema and the replayer agree: every op it lists replays without a field
/// error when it has exactly its required fields, a missing one or a stray one is an error line,
/// and every fixture op the reference answered without an error validates.
#[test]
fn the_oplog_schema_matches_the_replayer() {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo("docs/schemas/oplog.schema.json")).unwrap(),
    )
    .unwrap();
    let sample = |t: &str| match t {
        "string" => serde_json::json!("x"),
        "integer" => serde_json::json!(1),
        "number" => serde_json::json!(1.5),
        _ => serde_json::json!(true),
    };
    let ops = schema["oneOf"].as_array().unwrap();
    assert_eq!(ops.len(), 8);
    for op in ops {
        let name = op["properties"]["op"]["const"].as_str().unwrap();
        let mut line = serde_json::Map::new();
        for f in op["required"].as_array().unwrap() {
            let f = f.as_str().unwrap();
            let p = &op["properties"][f];
            let v = match (p.get("const"), p.get("enum"), p["type"].as_str()) {
                (Some(c), _, _) => c.clone(),
                (_, Some(e), _) => e[0].clone(),
                (_, _, Some(t)) => sample(t),
                _ => unreachable!(),
            };
            line.insert(f.into(), v);
        }
        let whole = serde_json::Value::Object(line.clone());
        assert!(valid(&schema, &schema, &whole), "{whole}");
        let out = replay_str(&whole.to_string()).remove(0);
        for bad in ["missing field", "unknown field", "must be", "unknown op"] {
            assert!(!out.contains(bad), "{name}: {whole} gave {out}");
        }
        for f in op["required"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| *f != "op")
        {
            let mut less = line.clone();
            less.remove(f.as_str().unwrap());
            let out = replay_str(&serde_json::Value::Object(less).to_string()).remove(0);
            assert!(out.contains("missing field"), "{name} without {f}: {out}");
        }
        let mut more = line.clone();
        more.insert("stray".into(), serde_json::json!(1));
        let more = serde_json::Value::Object(more);
        assert!(!valid(&schema, &schema, &more));
        assert!(replay_str(&more.to_string())[0].contains("unknown field"));
    }
    let log = std::fs::read_to_string(repo("scenarios/oplogs/reference.expect.jsonl")).unwrap();
    let mut checked = 0;
    for l in log.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        if v["expect"] != "error" {
            assert!(valid(&schema, &schema, &v), "{l}");
            checked += 1;
        }
    }
    assert!(checked >= 20, "{checked} fixture ops checked");
}
