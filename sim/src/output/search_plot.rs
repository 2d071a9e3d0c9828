//! The capacity search, drawn: for each SLO metric, every candidate each policy tried (its value
//! across, the metric's 95 % bound up), passes filled and failures hollow, and the SLO's line.

use std::path::Path;

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
    top.draw_text(
        &title,
        &("sans-serif", 22).into_font().color(&BLACK),
        (20, 12),
    )?;
    let metrics: [(&str, Pick, f64); 3] = [
        (
            "TTFT p99 (ms), upper bound",
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
            let c = palette(i);
            let points = a.probes.iter().map(|p| {
                let style = if p.passed {
                    c.filled()
                } else {
                    c.stroke_width(2)
                };
                Circle::new((p.value, pick(p).min(ymax)), 5, style)
            });
            chart
                .draw_series(points)?
                .label(a.policy.replace('_', " "))
                .legend(move |(x, y)| Circle::new((x + 10, y), 5, c.filled()));
        }
        super::plots::legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    }
    area.present()?;
    Ok(())
}
