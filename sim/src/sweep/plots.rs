//! A sweep's plots, written with its results: each headline metric against each numeric axis,
//! one line per policy (and value of the other axes) with its 95 % band over seeds. Every line
//! has its own marker shape as well as its colour, so two policies that coincide both show.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::summary::{groups_of, mean_ci, Group};
use super::{Plan, SweepError};
use crate::output::plots::{fonts, markers, palette};

/// The metrics drawn, as `results.csv` names them, and their axis labels.
/// The `jobs_*` ones are empty, so not drawn, in a sweep without a `Jobs` source.
const DRAWN: [(&str, &str); 11] = [
    ("leaked_gpu_s", "leaked GPU-s"),
    ("sibling_survival_rate", "sibling survival"),
    ("ttft_p50_ms", "time to first token p50 (ms)"),
    ("ttft_p99_ms", "time to first token p99 (ms)"),
    ("e2e_p50_ms", "E2E p50 (ms)"),
    ("e2e_p99_ms", "E2E p99 (ms)"),
    ("output_tokens_per_s", "output tokens/s"),
    ("admission_stalls", "admission stalls"),
    ("jobs_cleanup_p99_ms", "job cleanup p99 (ms)"),
    ("jobs_leaked_gpu_s", "jobs' GPU-s after their decisions"),
    (
        "jobs_usage_gap_tokens",
        "usage gap, true - reported (tokens)",
    ),
];

/// One line: its label and its points (axis value, mean, half-width), by axis value.
type Line = (String, Vec<(f64, f64, f64)>);

/// Draw every (numeric axis, metric) plot into `out/plots/`; returns the files written.
pub fn draw(plan: &Plan, out: &Path) -> Result<Vec<PathBuf>, SweepError> {
    let (names, groups) = groups_of(plan, out)?;
    let axis_names: Vec<&str> = plan.sweep.grid.iter().map(|a| a.name()).collect();
    let numeric: Vec<usize> = (0..axis_names.len())
        .filter(|&i| axis_names[i] != "policy")
        .filter(|&i| groups.iter().all(|g| g.axes[i].parse::<f64>().is_ok()))
        .collect();
    let dir = out.join("plots");
    let io = |e: String| SweepError::Io(format!("{}: {e}", dir.display()));
    if !numeric.is_empty() {
        std::fs::create_dir_all(&dir).map_err(|e| io(e.to_string()))?;
    }
    fonts();
    let mut written = Vec::new();
    for &axis in &numeric {
        for (metric, label) in DRAWN {
            let Some(k) = names.iter().position(|n| n == metric) else {
                continue;
            };
            let lines = lines(&groups, &axis_names, axis, k);
            let path = dir.join(format!("{metric}_vs_{}.png", axis_names[axis]));
            {
                let area = BitMapBackend::new(&path, (1000, 600)).into_drawing_area();
                chart(&area, &lines, (axis_names[axis], label))
                    .map_err(|e| io(format!("{}: {e}", path.display())))?;
            }
            written.push(path);
        }
    }
    Ok(written)
}

/// The lines of metric column `k` against axis `axis`: one per policy and value of the other
/// axes, in order of first appearance.
fn lines(groups: &[Group], axis_names: &[&str], axis: usize, k: usize) -> Vec<Line> {
    let mut lines: Vec<Line> = Vec::new();
    for g in groups {
        let others: Vec<String> = (0..axis_names.len())
            .filter(|&i| i != axis && axis_names[i] != "policy")
            .map(|i| format!("{}={}", axis_names[i], g.axes[i]))
            .collect();
        let mut label = g.policy.replace('_', " ");
        if !others.is_empty() {
            label = format!("{label}, {}", others.join(", "));
        }
        let (mean, half) = mean_ci(&g.values[k]);
        // One seed: no band to draw.
        let half = if half.is_nan() { 0.0 } else { half };
        let x: f64 = g.axes[axis].parse().expect("a numeric axis");
        match lines.iter_mut().find(|(l, _)| *l == label) {
            Some((_, points)) => points.push((x, mean, half)),
            None => lines.push((label, vec![(x, mean, half)])),
        }
    }
    for (_, points) in &mut lines {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    lines
}

fn chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    lines: &[Line],
    (axis, metric): (&str, &str),
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    area.fill(&WHITE)?;
    let all = || {
        lines
            .iter()
            .flat_map(|(_, p)| p.iter())
            .filter(|p| p.1.is_finite())
    };
    let half = |h: f64| if h.is_finite() { h } else { 0.0 };
    let (x0, x1) = all().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (y0, y1) = all().fold((f64::MAX, f64::MIN), |(a, b), p| {
        (a.min(p.1 - half(p.2)), b.max(p.1 + half(p.2)))
    });
    let (x0, x1) = if x0 < x1 {
        (x0, x1)
    } else {
        (x0 - 1.0, x0 + 1.0)
    };
    let pad = if y1 > y0 { (y1 - y0) * 0.08 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{metric} against {axis} (mean, 95 % band over seeds)"),
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, (y0 - pad).min(0.0f64.max(y0 - pad))..y1 + pad)?;
    chart.configure_mesh().x_desc(axis).y_desc(metric).draw()?;
    for (i, (label, points)) in lines.iter().enumerate() {
        let c = palette(i);
        let band: Vec<(f64, f64)> = points
            .iter()
            .map(|p| (p.0, p.1 + half(p.2)))
            .chain(points.iter().rev().map(|p| (p.0, p.1 - half(p.2))))
            .collect();
        chart.draw_series(std::iter::once(Polygon::new(band, c.mix(0.12).filled())))?;
        let xy = points.iter().map(|p| (p.0, p.1));
        chart.draw_series(LineSeries::new(xy, c.stroke_width(2)))?;
        let xy = points.iter().map(|p| (p.0, p.1));
        markers(&mut chart, i, xy, (4, 2), label.clone())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 14))
        .draw()?;
    area.present()?;
    Ok(())
}
