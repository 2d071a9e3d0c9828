//! The capacity search, drawn: for each SLO metric, every candidate each policy tried (its value
//! across, the metric's 95 % bound up), passes filled and failures hollow, and the SLO's line.

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::plots::palette;
use crate::search::{Answer, Probe, Slo};

type Pick = fn(&Probe) -> f64;

/// Draw the search to `path` (PNG, or SVG when the name ends in `.svg`).
pub fn draw(path: &Path, answers: &[Answer], slo: Slo, knob: &str) -> Result<(), String> {
    super::plots::fonts();
    let err = |e: Box<dyn std::error::Error>| format!("{}: {e}", path.display());
    let size = (1200, 1000);
    if path.extension().is_some_and(|x| x == "svg") {
        let area = SVGBackend::new(path, size).into_drawing_area();
        panels(&area, answers, slo, knob).map_err(err)
    } else {
        let area = BitMapBackend::new(path, size).into_drawing_area();
        panels(&area, answers, slo, knob).map_err(err)
    }
}

fn panels<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    answers: &[Answer],
    slo: Slo,
    knob: &str,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    area.fill(&WHITE)?;
    let (top, rest) = area.split_vertically(50);
    let title = format!("Capacity search over {knob}: filled candidates meet the whole SLO");
    super::plots::label(&top, &title, 22, (20, 12))?;
    let metrics: [(&str, Pick, f64); 3] = [
        (
            "time to first token p99 (ms), upper bound",
            |p| p.ttft_p99_ms_upper,
            slo.ttft_p99_ms,
        ),
        (
            "E2E p99 (ms), upper bound",
            |p| p.e2e_p99_ms_upper,
            slo.e2e_p99_ms,
        ),
        (
            "sibling survival, lower bound",
            |p| p.sibling_survival_lower,
            slo.sibling_survival_min,
        ),
    ];
    let all = || answers.iter().flat_map(|a| a.probes.iter());
    let xmax = all().map(|p| p.value).fold(1.0f64, f64::max) * 1.05;
    for (panel, (caption, pick, line)) in rest.split_evenly((3, 1)).iter().zip(metrics) {
        let ymax = all()
            .map(pick)
            .filter(|y| y.is_finite())
            .fold(line, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..xmax, 0f64..ymax.max(1e-9))?;
        chart
            .configure_mesh()
            .x_desc(knob)
            .max_light_lines(2)
            .draw()?;
        chart.draw_series(LineSeries::new(
            [(0.0, line), (xmax, line)],
            BLACK.stroke_width(1),
        ))?;
        for (i, a) in answers.iter().enumerate() {
            let at = |p: &Probe| (p.value, pick(p).min(ymax));
            let passed: Vec<_> = a.probes.iter().filter(|p| p.passed).map(at).collect();
            let failed: Vec<_> = a.probes.iter().filter(|p| !p.passed).map(at).collect();
            let label = a.policy.replace('_', " ");
            // Earlier policies are drawn larger, so a later one drawn over the same point
            // stays visible inside it.
            let r = 5 + 2 * ((answers.len() - 1 - i) / 3) as i32;
            glyphs(&mut chart, (i, r), passed, (true, Some(label)))?;
            glyphs(&mut chart, (i, r), failed, (false, None))?;
        }
        super::plots::legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    }
    area.present()?;
    Ok(())
}

/// Policy `i`'s probes at `points`, in its marker of radius `r`: a circle, a triangle or a square
/// by `i`, filled for a pass and hollow for a failure, so two policies with the same probes both
/// show, and pass and failure stay apart. `label` names the policy in the legend (once per
/// policy).
fn glyphs<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    (i, r): (usize, i32),
    points: Vec<(f64, f64)>,
    (filled, label): (bool, Option<String>),
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let c = palette(i);
    let style = if filled {
        c.filled()
    } else {
        c.stroke_width(2)
    };
    let pts = points.into_iter();
    let anno = match i % 3 {
        0 => chart.draw_series(pts.map(|p| Circle::new(p, r, style)))?,
        1 => chart.draw_series(pts.map(|p| TriangleMarker::new(p, r + 2, style)))?,
        _ => chart.draw_series(
            pts.map(|p| EmptyElement::at(p) + Rectangle::new([(-r, -r), (r, r)], style)),
        )?,
    };
    if let Some(label) = label {
        let anno = anno.label(label);
        match i % 3 {
            0 => anno.legend(move |(x, y)| Circle::new((x + 10, y), r, c.filled())),
            1 => anno.legend(move |(x, y)| TriangleMarker::new((x + 10, y), r + 2, c.filled())),
            _ => anno.legend(move |(x, y)| {
                Rectangle::new([(x + 10 - r, y - r), (x + 10 + r, y + r)], c.filled())
            }),
        };
    }
    Ok(())
}
