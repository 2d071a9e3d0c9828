//! A JSON scenario writes named fields as objects. serde reads a struct from a JSON array too,
//! by position (`"Custom": [10.0, 1000, ...]`), so a list typed where an object belongs could
//! load with its values in the wrong fields. The scenario as parsed, serialised back, shows
//! where objects belong; the text must have an object there.

use serde_json::Value;

/// The path of the first value (in key order) that `input` writes as an array where the parsed
/// scenario, serialised as `canonical`, holds an object; `None` if there is none.
pub(super) fn positional_struct(input: &Value, canonical: &Value) -> Option<String> {
    let mut path = Vec::new();
    walk(input, canonical, &mut path).then(|| path.join("."))
}

/// True, with `path` at the offending value, if one is found under `input`.
fn walk(input: &Value, canonical: &Value, path: &mut Vec<String>) -> bool {
    match (input, canonical) {
        (Value::Array(_), Value::Object(_)) => true,
        (Value::Object(fields), Value::Object(held)) => {
            for (key, value) in fields {
                let Some(expect) = held.get(key) else {
                    continue;
                };
                path.push(key.clone());
                if walk(value, expect, path) {
                    return true;
                }
                path.pop();
            }
            false
        }
        (Value::Array(items), Value::Array(held)) => {
            let Some(last) = path.pop() else {
                return false; // A scenario's root is an object; no list to index.
            };
            for (i, (value, expect)) in items.iter().zip(held).enumerate() {
                path.push(format!("{last}[{i}]"));
                if walk(value, expect, path) {
                    return true;
                }
                path.pop();
            }
            path.push(last);
            false
        }
        _ => false,
    }
}

/// Whether `input` holds an array at `path` (`a.b[2].c`, as serde_path_to_error writes it).
pub(super) fn array_at(input: &Value, path: &str) -> bool {
    let mut at = input;
    for seg in path.split('.') {
        let (name, indices) = seg.split_once('[').map_or((seg, ""), |(n, rest)| (n, rest));
        let Some(next) = at.get(name) else {
            return false;
        };
        at = next;
        for index in indices.split('[').filter(|i| !i.is_empty()) {
            let Some(next) = index
                .trim_end_matches(']')
                .parse::<usize>()
                .ok()
                .and_then(|i| at.get(i))
            else {
                return false;
            };
            at = next;
        }
    }
    at.is_array()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_array_where_an_object_belongs_is_found_with_its_path() {
        let canonical = json!({"cluster": {"profile": {"Custom": {"c0_ms": 10.0, "kv": 1}}}});
        let input = json!({"cluster": {"profile": {"Custom": [10.0, 1]}}});
        assert_eq!(
            positional_struct(&input, &canonical).as_deref(),
            Some("cluster.profile.Custom")
        );
        assert_eq!(positional_struct(&canonical, &canonical), None);
    }

    #[test]
    fn an_array_is_found_at_an_error_path() {
        let input = json!({"a": {"B": [1, 2]}, "l": [{"x": [3]}]});
        assert!(array_at(&input, "a.B"));
        assert!(array_at(&input, "l[0].x"));
        assert!(!array_at(&input, "a"));
        assert!(!array_at(&input, "a.C"));
        assert!(!array_at(&input, "l[1].x"));
    }

    #[test]
    fn lists_of_objects_are_walked_item_by_item() {
        let canonical = json!({"phases": [{"at": 1}, {"at": 2}], "tags": ["a"]});
        let fine = json!({"phases": [{"at": 1}, {"at": 2}], "tags": ["a"]});
        assert_eq!(positional_struct(&fine, &canonical), None);
        let bad = json!({"phases": [{"at": 1}, [2]], "tags": ["a"]});
        assert_eq!(
            positional_struct(&bad, &canonical).as_deref(),
            Some("phases[1]")
        );
        // Keys the scenario does not hold (a "$schema" line, defaults) are not walked.
        let extra = json!({"$schema": [1], "phases": [{"at": 1}]});
        assert_eq!(positional_struct(&extra, &canonical), None);
    }
}
