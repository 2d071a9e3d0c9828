//! The fit table of `docs/validation.md`, which a test keeps equal to [`fit_table`]: every point,
//! published ([`super::fit`]) and measured by the database ([`super::aic`]), beside the model.

use super::fit::{Point, Scope, PUBLISHED};

/// Every point of the table, in its order: the published ones, then the database's.
pub fn points() -> Vec<Point> {
    let mut all = PUBLISHED.to_vec();
    all.extend(super::aic::points());
    all
}

/// The table as `docs/validation.md` shows it (Markdown).
pub fn fit_table() -> String {
    let mut s = String::from(
        "| profile | scope | point | published ms | model ms | error | source |\n\
         |---|---|---|---:|---:|---:|---|\n",
    );
    for p in points() {
        let scope = match p.scope {
            Scope::Blocks => "blocks",
            Scope::Layers => "layers",
            Scope::Step => "step",
        };
        let source = match (p.why_not_fitted(), p.known_miss()) {
            (Some(why), _) => format!("{}; not fitted: {why}", p.source),
            (None, Some(miss)) => format!("{}; known miss: {}", p.source, miss.3),
            (None, None) => p.source.to_string(),
        };
        s += &format!(
            "| {} | {scope} | {} | {:.2} | {:.2} | {:+.1} % | {source} |\n",
            p.profile.name,
            p.what(),
            p.published_us as f64 / 1e3,
            p.model_us() / 1e3,
            p.error_pct(),
        );
    }
    s
}
