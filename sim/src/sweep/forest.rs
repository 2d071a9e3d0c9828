//! A comparison's forest plot: one panel per metric, one row per group, the mean difference
//! B − A with its 95 % interval, a line at 0, and significant rows (after Holm) filled.

use std::path::Path;

use plotters::prelude::*;

use super::compare::Comparison;

impl Comparison {
    /// Draw the forest plot to `path` (PNG, or SVG when the name ends in `.svg`).
    pub fn forest(&self, path: &Path) -> Result<(), String> {
        crate::output::plots::fonts();
        let metrics = metrics(self);
        let rows = metrics.len().div_ceil(2).max(1) as u32;
        let groups = groups(self);
        let height = 80 + rows * (90 + 22 * groups.len() as u32);
        let size = (1200, height.min(8000));
        let draw = |e: Box<dyn std::error::Error>| format!("{}: {e}", path.display());
        if path.extension().is_some_and(|x| x == "svg") {
            let area = SVGBackend::new(path, size).into_drawing_area();
            self.draw(&area, &metrics, &groups).map_err(draw)
        } else {
            let area = BitMapBackend::new(path, size).into_drawing_area();
            self.draw(&area, &metrics, &groups).map_err(draw)
        }
    }

    fn draw<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, plotters::coord::Shift>,
        metrics: &[&'static str],
        groups: &[String],
    ) -> Result<(), Box<dyn std::error::Error>>
    where
        DB::ErrorType: 'static,
    {
        area.fill(&WHITE)?;
        let (top, rest) = area.split_vertically(70);
        let title = format!(
            "B − A: A = {}, B = {} (95 % intervals; filled: significant after Holm)",
            self.a, self.b
        );
        crate::output::plots::label(&top, &title, 20, (20, 10))?;
        let panels = rest.split_evenly((metrics.len().div_ceil(2).max(1), 2));
        for (panel, metric) in panels.iter().zip(metrics) {
            let tests: Vec<_> = self.tests.iter().filter(|t| t.metric == *metric).collect();
            let lo = tests
                .iter()
                .map(|t| t.ci95_low.min(t.mean))
                .filter(|x| x.is_finite())
                .fold(0.0f64, f64::min);
            let hi = tests
                .iter()
                .map(|t| t.ci95_high.max(t.mean))
                .filter(|x| x.is_finite())
                .fold(0.0f64, f64::max);
            let pad = if hi > lo { (hi - lo) * 0.1 } else { 1.0 };
            let n = groups.len() as f64;
            let mut chart = ChartBuilder::on(panel)
                .caption(*metric, ("sans-serif", 16))
                .margin(8)
                .x_label_area_size(24)
                .y_label_area_size(150)
                .build_cartesian_2d(lo - pad..hi + pad, -0.5f64..n - 0.5)?;
            let label = |y: &f64| {
                let i = y.round() as usize;
                groups
                    .get(i)
                    .map_or(String::new(), |g| g.chars().take(22).collect())
            };
            let span = hi - lo + 2.0 * pad;
            let x_label = |x: &f64| tick(*x, span);
            chart
                .configure_mesh()
                .x_labels(5)
                .x_label_formatter(&x_label)
                .y_labels(groups.len().max(1))
                .y_label_formatter(&label)
                .disable_y_mesh()
                .draw()?;
            chart.draw_series(LineSeries::new(
                [(0.0, -0.5), (0.0, n - 0.5)],
                BLACK.stroke_width(1),
            ))?;
            for t in tests {
                let y = groups.iter().position(|g| *g == t.group).unwrap_or(0) as f64;
                let c = if t.significant {
                    RGBColor(214, 39, 40)
                } else {
                    RGBColor(31, 119, 180)
                };
                if t.ci95_low.is_finite() {
                    let whisker = [(t.ci95_low, y), (t.ci95_high, y)];
                    chart.draw_series(LineSeries::new(whisker, c.stroke_width(2)))?;
                }
                let style = if t.significant {
                    c.filled()
                } else {
                    c.stroke_width(2)
                };
                chart.draw_series(std::iter::once(Circle::new((t.mean, y), 5, style)))?;
            }
        }
        area.present()?;
        Ok(())
    }
}

/// An axis value with the decimals an axis of `span` needs (three significant digits of it),
/// and a value that rounds to zero as 0: the line at 0 is the plot's reference, and plotters'
/// default writes a tick a rounding error below it as -0.0.
fn tick(x: f64, span: f64) -> String {
    let decimals = (2.0 - span.abs().max(1e-9).log10().floor()).clamp(0.0, 9.0) as usize;
    let s = format!("{x:.decimals$}");
    if s.bytes().all(|b| matches!(b, b'-' | b'0' | b'.')) {
        "0".into()
    } else {
        s
    }
}

fn metrics(c: &Comparison) -> Vec<&'static str> {
    let mut m: Vec<&'static str> = Vec::new();
    for t in &c.tests {
        if !m.contains(&t.metric) {
            m.push(t.metric);
        }
    }
    m
}

fn groups(c: &Comparison) -> Vec<String> {
    let mut g: Vec<String> = Vec::new();
    for t in &c.tests {
        if !g.contains(&t.group) {
            g.push(t.group.clone());
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::tick;

    #[test]
    fn ticks_have_the_axis_precision_and_no_negative_zero() {
        assert_eq!(tick(-1e-17, 0.4), "0");
        assert_eq!(tick(-0.0, 2.0), "0");
        assert_eq!(tick(0.125, 0.4), "0.125");
        assert_eq!(tick(-0.1, 0.4), "-0.100");
        assert_eq!(tick(250.0, 800.0), "250");
        assert_eq!(tick(-12.5, 50.0), "-12.5");
    }
}
