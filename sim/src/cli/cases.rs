//! What `check` found, case by case, in the formats CI systems read: JUnit XML and JSON. In
//! those formats the human lines go to stderr and standard output carries the one document, so
//! `cancelsim check --format junit > check.xml` is all a pipeline needs.

use serde_json::json;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One line per scenario on standard output.
    #[default]
    Text,
    /// JUnit XML: a test suite per kind of check, a test case per scenario, golden file, swarm
    /// and fuzz tier.
    Junit,
    /// The same cases as one JSON object.
    Json,
}

/// One test case: a scenario file, a golden file, a scenario's swarm, or a fuzz tier.
pub struct Case {
    pub suite: &'static str,
    pub name: String,
    pub secs: f64,
    /// Empty when it passed.
    pub failures: Vec<String>,
}

pub struct Cases {
    format: Format,
    list: Vec<Case>,
}

impl Cases {
    pub fn new(format: Format) -> Cases {
        Cases {
            format,
            list: Vec::new(),
        }
    }

    /// A line for people: standard output in text mode, standard error otherwise.
    pub fn line(&self, text: &str) {
        match self.format {
            Format::Text => say!("{text}"),
            _ => eprintln!("{text}"),
        }
    }

    pub fn case(&mut self, suite: &'static str, name: String, secs: f64, failures: Vec<String>) {
        self.list.push(Case {
            suite,
            name,
            secs,
            failures,
        });
    }

    /// The document for standard output, or `None` in text mode.
    pub fn document(&self, commit: &str) -> Option<String> {
        match self.format {
            Format::Text => None,
            Format::Junit => Some(junit(&self.list)),
            Format::Json => Some(self.json(commit)),
        }
    }

    fn json(&self, commit: &str) -> String {
        let cases: Vec<_> = self
            .list
            .iter()
            .map(|c| {
                json!({
                    "suite": c.suite,
                    "name": c.name,
                    "time_s": c.secs,
                    "ok": c.failures.is_empty(),
                    "failures": c.failures,
                })
            })
            .collect();
        let failed = self.list.iter().filter(|c| !c.failures.is_empty()).count();
        let doc = json!({
            "commit": commit,
            "cases": cases.len(),
            "failed": failed,
            "results": cases,
        });
        serde_json::to_string_pretty(&doc).expect("a JSON value serialises")
    }
}

/// Text made safe for XML attributes and content (control characters other than tab and
/// newline are not allowed in XML 1.0, so they become spaces).
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' => out.push(ch),
            c if (c as u32) < 0x20 => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

fn junit(cases: &[Case]) -> String {
    let failed = |c: &&Case| !c.failures.is_empty();
    let total_s: f64 = cases.iter().map(|c| c.secs).sum();
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    x += &format!(
        "<testsuites name=\"cancelsim check\" tests=\"{}\" failures=\"{}\" time=\"{total_s:.3}\">\n",
        cases.len(),
        cases.iter().filter(failed).count()
    );
    let mut suites: Vec<&str> = cases.iter().map(|c| c.suite).collect();
    suites.dedup();
    suites.sort_unstable();
    suites.dedup();
    for suite in suites {
        let here: Vec<&Case> = cases.iter().filter(|c| c.suite == suite).collect();
        let secs: f64 = here.iter().map(|c| c.secs).sum();
        x += &format!(
            "  <testsuite name=\"{suite}\" tests=\"{}\" failures=\"{}\" time=\"{secs:.3}\">\n",
            here.len(),
            here.iter().filter(|c| failed(c)).count()
        );
        for c in here {
            let head = format!(
                "    <testcase classname=\"cancelsim.{suite}\" name=\"{}\" time=\"{:.3}\"",
                escape(&c.name),
                c.secs
            );
            if c.failures.is_empty() {
                x += &format!("{head}/>\n");
                continue;
            }
            let first = escape(&c.failures[0]);
            let all = escape(&c.failures.join("\n"));
            x += &format!("{head}>\n      <failure message=\"{first}\">{all}</failure>\n");
            x += "    </testcase>\n";
        }
        x += "  </testsuite>\n";
    }
    x + "</testsuites>\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn junit_escapes_and_counts() {
        let cases = vec![
            Case {
                suite: "scenario",
                name: "a<b>.ron".into(),
                secs: 0.5,
                failures: vec![],
            },
            Case {
                suite: "scenario",
                name: "c.ron".into(),
                secs: 0.25,
                failures: vec!["hash \"x\" & y\u{1}".into(), "second".into()],
            },
            Case {
                suite: "fuzz",
                name: "fuzz-small".into(),
                secs: 1.0,
                failures: vec![],
            },
        ];
        let x = junit(&cases);
        assert!(x.contains("tests=\"3\" failures=\"1\""), "{x}");
        assert!(x.contains("name=\"a&lt;b&gt;.ron\""), "{x}");
        assert!(x.contains("message=\"hash &quot;x&quot; &amp; y \""), "{x}");
        assert!(
            x.contains(">hash &quot;x&quot; &amp; y \nsecond</failure>"),
            "{x}"
        );
        assert_eq!(x.matches("<testsuite ").count(), 2);
        assert_eq!(x.matches("<testcase ").count(), 3);
        assert_eq!(x.matches("</testsuite>").count(), 2);
    }
}
