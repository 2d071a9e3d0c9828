//! The report's per-request and over-time charts: cleanup latency, KV retained after intent,
//! and siblings' time to first token. Each policy gets its own panel or its own marker, so two
//! policies that coincide stay visible, and a run without cancellations says so instead of
//! drawing empty axes.

use plotters::coord::Shift;
use plotters::prelude::*;

use super::plots::{
    label, legend, markers, palette, per_policy, small_panel, swatch, Axes, Charts, Res,
};
use crate::metrics::Summary;
use crate::record::PAIRS_MAX;
use crate::run::Report;

/// Whether no run of the report had a cancel intent.
fn no_cancellations(report: &Report) -> bool {
    report.policies.iter().all(|p| p.cancel_rpc.intents == 0)
}

/// A chart with nothing to draw: its title and why.
fn nothing<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, title: &str, why: &str) -> Res
where
    DB::ErrorType: 'static,
{
    label(area, title, 26, (20, 12))?;
    let (w, h) = area.dim_in_pixel();
    let x = w as i32 / 2 - 8 * why.len() as i32 / 2 * 3 / 2;
    label(area, why, 24, (x, h as i32 / 2))
}

/// A title strip over panels: the title and a second line of notes.
fn title_strip<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, title: &str, note: &str) -> Res
where
    DB::ErrorType: 'static,
{
    label(area, title, 24, (20, 8))?;
    label(area, note, 16, (20, 40))
}

impl Charts<'_> {
    /// One panel per policy: the latency from intent to each evidence level, as a CDF. The x
    /// axis starts left of 0, so levels reached at once show as a line at 0, not under the axis.
    pub(super) fn cleanup_cdf<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Res
    where
        DB::ErrorType: 'static,
    {
        let title = "Cleanup latency from intent, per evidence level";
        if no_cancellations(self.report) {
            return nothing(
                area,
                title,
                "no cancellations in this run: nothing to clean up",
            );
        }
        let n = self.report.policies.len();
        let cols = if n > 1 { 2 } else { 1 };
        let (top, rest) = area.split_vertically(70);
        let note = "one panel per policy, each on its own scale; legend: p99, requests with no such evidence (unknown), \
                    and intents after completion (n/a)";
        title_strip(&top, title, note)?;
        let panels = rest.split_evenly((n.div_ceil(cols), cols));
        for (i, (panel, policy)) in panels.iter().zip(&self.report.policies).enumerate() {
            let cdfs = self.extras.get(i + 1).map(|e| &e.cleanup_cdf_ms);
            // Each panel its own scale: one slow policy would flatten the others.
            let xmax = cdfs
                .iter()
                .flat_map(|c| c.values().flat_map(|v| v.iter().map(|p| p.0)))
                .fold(0.0f64, f64::max)
                .max(1.0);
            cdf_panel(panel, policy, cdfs, xmax)?;
        }
        Ok(())
    }

    /// One panel per policy, stacked on one time axis: blocks held by requests after their
    /// intent, as steps between samples. Peaks between samples are not drawn; each caption gives
    /// the true peak, which the run tracks at every event.
    pub(super) fn kv_retained<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Res
    where
        DB::ErrorType: 'static,
    {
        let title = "KV blocks retained by cancelled requests, over time";
        if no_cancellations(self.report) {
            return nothing(
                area,
                title,
                "no cancellations in this run: nothing retained",
            );
        }
        let series = per_policy(self.report, self.extras, |e| e.timeseries.as_slice());
        let every_ms = series
            .iter()
            .find_map(|(_, s)| (s.len() > 1).then(|| (s[1].t_s - s[0].t_s) * 1e3))
            .unwrap_or(0.0);
        let tmax = series.iter().flat_map(|(_, s)| s.last().map(|x| x.t_s));
        let tmax = tmax.fold(0.0f64, f64::max).max(1.0);
        let ymax = series
            .iter()
            .flat_map(|(_, s)| s.iter().map(|x| x.kv_retained));
        let ymax = ymax.max().unwrap_or(0).max(1) as f64 * 1.1;
        let (top, rest) = area.split_vertically(70);
        let note = format!(
            "all replicas, sampled every {every_ms:.0} ms of virtual time (steps between samples); \
             each caption gives the run's true peak on one replica"
        );
        title_strip(&top, title, &note)?;
        let panels = rest.split_evenly((series.len().max(1), 1));
        for (i, ((name, samples), panel)) in series.iter().zip(panels.iter()).enumerate() {
            let peak = self.report.policies[i].retained.peak_blocks;
            let caption = format!("{}: peak {peak} blocks", name.replace('_', " "));
            let mut chart = small_panel(panel, &caption, 0f64..tmax, 0f64..ymax)?;
            let steps = samples.windows(2).flat_map(|w| {
                let y = w[0].kv_retained as f64;
                [(w[0].t_s, y), (w[1].t_s, y)]
            });
            chart.draw_series(LineSeries::new(steps, palette(i).stroke_width(1)))?;
        }
        Ok(())
    }

    /// Siblings' time to first token against the counterfactual's, one marker shape per policy.
    pub(super) fn sibling_ttft<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Res
    where
        DB::ErrorType: 'static,
    {
        let title = "Siblings' time to first token during the storm, against the counterfactual";
        let series = per_policy(self.report, self.extras, |e| e.sibling_ttft_ms.as_slice());
        if no_cancellations(self.report) || series.iter().all(|(_, s)| s.is_empty()) {
            return nothing(
                area,
                title,
                "no cancellations in this run: no siblings to compare",
            );
        }
        let max = series
            .iter()
            .flat_map(|(_, s)| s.iter().map(|&(a, b)| a.max(b)))
            .fold(0.0f64, f64::max)
            .max(1.0)
            * 1.05;
        let capped = series.iter().any(|(_, s)| s.len() >= PAIRS_MAX);
        let caption = if capped {
            format!("{title} (first {PAIRS_MAX} pairs per policy)")
        } else {
            title.to_string()
        };
        let axes = Axes {
            caption: &caption,
            x_desc: "time to first token without cancellations (ms)",
            y_desc: "time to first token with cancellations (ms)",
            y_label_area: 70,
        };
        let mut chart = axes.chart(area, 0f64..max, 0f64..max)?;
        let diagonal = vec![(0.0, 0.0), (max, max)];
        chart.draw_series(LineSeries::new(diagonal, BLACK.stroke_width(1)))?;
        for (i, (name, pairs)) in series.iter().enumerate() {
            let label = format!("{} ({} siblings)", name.replace('_', " "), pairs.len());
            // A shape per policy, so a policy that coincides with another still shows.
            markers(&mut chart, i, pairs.iter().copied(), (3, 1), label)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        Ok(())
    }
}

/// One policy's cleanup CDFs, one line per evidence level: the thickest first, so a thinner line
/// drawn on top of a coinciding one still shows.
fn cdf_panel<DB: DrawingBackend>(
    panel: &DrawingArea<DB, Shift>,
    policy: &Summary,
    cdfs: Option<&std::collections::BTreeMap<String, Vec<(f64, f64)>>>,
    xmax: f64,
) -> Res
where
    DB::ErrorType: 'static,
{
    let mut chart = ChartBuilder::on(panel)
        .caption(policy.policy.replace('_', " "), ("sans-serif", 18))
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(50)
        .build_cartesian_2d(-0.03 * xmax..xmax * 1.05, 0f64..1.02)?;
    chart
        .configure_mesh()
        .max_light_lines(2)
        .x_desc("ms from intent (virtual time)")
        .draw()?;
    let Some(cdfs) = cdfs else {
        return Ok(());
    };
    let levels = cdfs.len() as u32;
    for (k, (level, points)) in cdfs.iter().enumerate() {
        let l = policy.cleanup_latency_ms.get(level);
        let (p99, unknown, na) = l.map_or((0.0, 0, 0), |l| (l.p99, l.unknown, l.not_applicable));
        let label = format!(
            "{}: p99 {p99:.1} ms, {unknown} unknown, {na} n/a",
            level.replace('_', " ")
        );
        let c = palette(k);
        let width = 2 + 2 * (levels - 1 - k as u32);
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                c.stroke_width(width),
            ))?
            .label(label)
            .legend(swatch(c, 3));
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    Ok(())
}
