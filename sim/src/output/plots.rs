//! The report's plots, as PNG and SVG, drawn with plotters and an embedded DejaVu font (so no
//! system font is needed):
//! - `policies`: leaked GPU-seconds, late discards and sibling survival per policy;
//! - `cleanup_cdf`: the cleanup-latency CDF per evidence level;
//! - `kv_retained`: KV blocks held by cancelled requests over time, per policy;
//! - `sibling_ttft`: siblings' TTFT against the counterfactual's;
//! - on a prefill/decode graph, `handoff_pinned` (blocks pinned per stage) and `pools` (each
//!   pool's KV blocks and queue); with a storm in time, `recovery`.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::metrics::Summary;
use crate::record::{Extras, Sample};
use crate::run::Report;

pub(crate) type Res = Result<(), Box<dyn std::error::Error>>;

pub(crate) fn fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).is_err() {
            panic!("the embedded DejaVu Sans font is a valid TTF");
        }
    });
}

const SIZE: (u32, u32) = (1200, 700);

pub(crate) fn palette(i: usize) -> RGBColor {
    const C: [RGBColor; 6] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
    ];
    C[i % C.len()]
}

/// The legend box every chart uses.
pub(super) fn legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Res
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .position(position)
        .label_font(("sans-serif", 16))
        .draw()?;
    Ok(())
}

/// One series per policy run: its label, and what `pick` takes from its extras (the
/// counterfactual's extras come first, so policy `i` has extras `i + 1`).
pub(super) fn per_policy<'a, T>(
    report: &'a Report,
    extras: &'a [Extras],
    pick: fn(&Extras) -> &[T],
) -> Vec<(&'a str, &'a [T])> {
    report
        .policies
        .iter()
        .enumerate()
        .filter_map(|(i, p)| extras.get(i + 1).map(|e| (p.policy.as_str(), pick(e))))
        .collect()
}

/// A line chart's frame: its caption, axis labels and the room for its y labels.
pub(super) struct Axes<'a> {
    pub(super) caption: &'a str,
    pub(super) x_desc: &'a str,
    pub(super) y_desc: &'a str,
    pub(super) y_label_area: u32,
}

pub(super) type LineChart<'a, DB> =
    ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

impl Axes<'_> {
    /// The chart on `area` over `x` × `y`, its mesh drawn.
    pub(super) fn chart<'a, DB: DrawingBackend>(
        &self,
        area: &'a DrawingArea<DB, Shift>,
        x: std::ops::Range<f64>,
        y: std::ops::Range<f64>,
    ) -> Result<LineChart<'a, DB>, Box<dyn std::error::Error>>
    where
        DB::ErrorType: 'static,
    {
        let mut chart = ChartBuilder::on(area)
            .caption(self.caption, ("sans-serif", 24))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(self.y_label_area)
            .build_cartesian_2d(x, y)?;
        chart
            .configure_mesh()
            .x_desc(self.x_desc)
            .y_desc(self.y_desc)
            .draw()?;
        Ok(chart)
    }
}

/// A small panel's chart over `x` × `y`, its caption above and a light mesh: the panels of a
/// chart drawn one per run or per pool.
pub(super) fn small_panel<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    caption: &str,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
) -> Result<LineChart<'a, DB>, Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(6)
        .x_label_area_size(24)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)?;
    chart.configure_mesh().max_light_lines(2).draw()?;
    Ok(chart)
}

/// The plots, by file name.
const CHARTS: [(&str, Chart); 4] = [
    ("policies", Chart::Policies),
    ("cleanup_cdf", Chart::CleanupCdf),
    ("kv_retained", Chart::KvRetained),
    ("sibling_ttft", Chart::SiblingTtft),
];

#[derive(Clone, Copy)]
enum Chart {
    Policies,
    CleanupCdf,
    KvRetained,
    SiblingTtft,
    /// A prefill/decode graph's only: the blocks pinned on each stage over time.
    HandoffPinned,
    /// A prefill/decode graph's only: each pool's KV blocks and queue over time.
    Pools,
    /// A storm in time's only: admission latency by arrival second, against the threshold.
    Recovery,
}

/// What the plots are drawn from.
pub(super) struct Charts<'a> {
    pub(super) report: &'a Report,
    pub(super) extras: &'a [Extras],
}

impl Charts<'_> {
    /// One chart on a white canvas of either backend.
    fn draw<DB: DrawingBackend>(&self, chart: Chart, area: DrawingArea<DB, Shift>) -> Res
    where
        DB::ErrorType: 'static,
    {
        area.fill(&WHITE)?;
        match chart {
            Chart::Policies => self.policies(&area)?,
            Chart::CleanupCdf => self.cleanup_cdf(&area)?,
            Chart::KvRetained => self.kv_retained(&area)?,
            Chart::SiblingTtft => self.sibling_ttft(&area)?,
            Chart::HandoffPinned => self.handoff_pinned(&area)?,
            Chart::Pools => self.pools(&area)?,
            Chart::Recovery => self.recovery(&area)?,
        }
        area.present()?;
        Ok(())
    }
}

/// Draw every plot into `dir`, as `<name>.png` and `<name>.svg`; returns the PNG paths.
pub fn draw_all(dir: &Path, report: &Report, extras: &[Extras]) -> Result<Vec<PathBuf>, String> {
    fonts();
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let charts = Charts { report, extras };
    let mut written = Vec::new();
    let handoff = report.counterfactual.handoff.is_some();
    let extra = handoff.then_some(("handoff_pinned", Chart::HandoffPinned));
    let pools = !report.counterfactual.pools.is_empty();
    let extra = extra
        .into_iter()
        .chain(pools.then_some(("pools", Chart::Pools)));
    let storm = report.counterfactual.recovery.is_some();
    let extra = extra
        .into_iter()
        .chain(storm.then_some(("recovery", Chart::Recovery)));
    for (name, chart) in CHARTS.into_iter().chain(extra) {
        let p = dir.join(format!("{name}.png"));
        let area = BitMapBackend::new(&p, SIZE).into_drawing_area();
        charts
            .draw(chart, area)
            .map_err(|e| format!("{}: {e}", p.display()))?;
        let s = dir.join(format!("{name}.svg"));
        let area = SVGBackend::new(&s, SIZE).into_drawing_area();
        charts
            .draw(chart, area)
            .map_err(|e| format!("{}: {e}", s.display()))?;
        written.push(p);
    }
    Ok(written)
}

/// The policies panel's metrics: caption, axis unit, value per policy.
type Metric = (&'static str, &'static str, fn(&Summary) -> f64);

const POLICY_METRICS: [Metric; 3] = [
    (
        "Leaked GPU work",
        "GPU-seconds after the cancel intent",
        |p| p.leaked_work.gpu_s,
    ),
    (
        "Late outputs discarded",
        "tokens produced after the terminal transition",
        |p| p.late_output_discards as f64,
    ),
    ("Sibling survival", "siblings survived / siblings", |p| {
        p.sibling_survival.rate
    }),
];

/// Black text of `size` points at pixel `at` of `area`: every title and note of the charts.
pub(crate) fn label<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
    size: u32,
    at: (i32, i32),
) -> Res
where
    DB::ErrorType: 'static,
{
    area.draw_text(text, &("sans-serif", size).into_font().color(&BLACK), at)?;
    Ok(())
}

/// The title strip: the chart's title, and a legend naming the bars (policy labels are too long
/// for the x axis).
fn policies_title<DB: DrawingBackend>(title: &DrawingArea<DB, Shift>, report: &Report) -> Res
where
    DB::ErrorType: 'static,
{
    let text = format!(
        "Policy comparison: {} (seed {}), against one counterfactual",
        report.scenario, report.seed
    );
    label(title, &text, 26, (20, 12))?;
    let mut x = 20;
    for (i, p) in report.policies.iter().enumerate() {
        title.draw(&Rectangle::new(
            [(x, 58), (x + 16, 74)],
            palette(i).filled(),
        ))?;
        let name = p.policy.replace('_', " ");
        label(title, &name, 18, (x + 22, 56))?;
        x += 40 + 10 * name.len() as i32;
    }
    Ok(())
}

/// One panel: a bar per policy.
fn policies_panel<DB: DrawingBackend>(
    panel: &DrawingArea<DB, Shift>,
    (caption, unit): (&str, &str),
    values: &[f64],
) -> Res
where
    DB::ErrorType: 'static,
{
    let max = values.iter().cloned().fold(0.0f64, f64::max);
    let top = if caption == "Sibling survival" {
        1.05
    } else if max > 0.0 {
        max * 1.15
    } else {
        1.0
    };
    let n = values.len().max(1) as f64;
    let mut chart = ChartBuilder::on(panel)
        .caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(20)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.5f64..n - 0.5, 0f64..top)?;
    bar_mesh(&mut chart, unit)?;
    chart.draw_series(values.iter().enumerate().map(|(i, v)| {
        let x = i as f64;
        Rectangle::new([(x - 0.35, 0.0), (x + 0.35, *v)], palette(i).filled())
    }))?;
    chart.draw_series(values.iter().enumerate().map(|(i, v)| {
        Text::new(
            value_label(*v),
            (i as f64 - 0.3, *v + top * 0.04),
            ("sans-serif", 14),
        )
    }))?;
    Ok(())
}

/// The mesh of a bar panel, on a linear or a log value axis: no x axis (the title strip names
/// the bars), the unit on y.
fn bar_mesh<DB: DrawingBackend, Y>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, Y>>,
    unit: &str,
) -> Res
where
    DB::ErrorType: 'static,
    Y: Ranged + ValueFormatter<Y::ValueType>,
{
    chart
        .configure_mesh()
        .disable_x_mesh()
        .disable_x_axis()
        .y_desc(unit)
        .y_label_style(("sans-serif", 14))
        .draw()?;
    Ok(())
}

/// A bar's value, as printed over it.
fn value_label(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e9 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// Bars whose positive values span more than this ratio are drawn on a log scale.
const LOG_RATIO: f64 = 50.0;

/// One panel on a log scale: a bar per policy from below the smallest positive value; a zero
/// bar is its printed 0 alone.
fn policies_panel_log<DB: DrawingBackend>(
    panel: &DrawingArea<DB, Shift>,
    (caption, unit): (&str, &str),
    values: &[f64],
    (low, high): (f64, f64),
) -> Res
where
    DB::ErrorType: 'static,
{
    let (bottom, top) = (low / 3.0, high * 3.0);
    let n = values.len().max(1) as f64;
    let mut chart = ChartBuilder::on(panel)
        .caption(format!("{caption} (log scale)"), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(20)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.5f64..n - 0.5, (bottom..top).log_scale())?;
    bar_mesh(&mut chart, unit)?;
    let bars = values.iter().enumerate().filter(|(_, v)| **v > 0.0);
    chart.draw_series(bars.map(|(i, v)| {
        let x = i as f64;
        Rectangle::new([(x - 0.35, bottom), (x + 0.35, *v)], palette(i).filled())
    }))?;
    chart.draw_series(values.iter().enumerate().map(|(i, v)| {
        Text::new(
            value_label(*v),
            (i as f64 - 0.3, v.max(bottom) * 1.3),
            ("sans-serif", 14),
        )
    }))?;
    Ok(())
}

impl Charts<'_> {
    /// Three panels: leaked GPU-s, late discards, sibling survival; one bar per policy.
    fn policies<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Res
    where
        DB::ErrorType: 'static,
    {
        let report = self.report;
        let (title, rest) = area.split_vertically(90);
        policies_title(&title, report)?;
        let panels = rest.split_evenly((1, 3));
        for (panel, (caption, unit, value)) in panels.iter().zip(POLICY_METRICS.iter()) {
            let values: Vec<f64> = report.policies.iter().map(value).collect();
            let positive = values.iter().copied().filter(|v| *v > 0.0);
            let low = positive.clone().fold(f64::INFINITY, f64::min);
            let high = positive.fold(0.0f64, f64::max);
            let survival = *caption == "Sibling survival";
            if !survival && low.is_finite() && high / low > LOG_RATIO {
                policies_panel_log(panel, (caption, unit), &values, (low, high))?;
            } else {
                policies_panel(panel, (caption, unit), &values)?;
            }
        }
        Ok(())
    }

    /// Blocks pinned for the handoff, one panel per stage, one line per run, as steps between
    /// samples. The counterfactual's are the transfers' own; the rest is what cancels strand.
    fn handoff_pinned<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Res
    where
        DB::ErrorType: 'static,
    {
        let cf = std::iter::once(self.report.counterfactual.policy.as_str());
        let names = cf.chain(self.report.policies.iter().map(|p| p.policy.as_str()));
        let runs: Vec<(&str, &[Sample])> = names
            .zip(self.extras.iter().map(|e| e.timeseries.as_slice()))
            .collect();
        let (top, bottom) = area.split_vertically(area.dim_in_pixel().1 / 2);
        type Pick = fn(&Sample) -> u64;
        let panels: [(&str, Pick, &DrawingArea<DB, Shift>); 2] = [
            (
                "prefill stage: blocks kept for transfers",
                |x| x.kv_pinned_prefill,
                &top,
            ),
            (
                "decode stage: receive blocks",
                |x| x.kv_pinned_decode,
                &bottom,
            ),
        ];
        for (caption, pick, panel) in panels {
            pinned_panel(panel, caption, &runs, pick)?;
        }
        Ok(())
    }

    /// Admission latency by arrival second, one line per run, on a log scale; the storm's window
    /// shaded and the degraded threshold drawn, so the time to recover can be read off.
    fn recovery<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Res
    where
        DB::ErrorType: 'static,
    {
        let cf = &self.report.counterfactual;
        let r = cf.recovery.expect("drawn only with a storm in time");
        let runs = std::iter::once(cf).chain(&self.report.policies);
        let series: Vec<(&str, &[(f64, f64)])> = runs
            .zip(self.extras)
            .map(|(s, e)| (s.policy.as_str(), e.admission_bins_ms.as_slice()))
            .collect();
        let points = series.iter().flat_map(|(_, b)| b.iter());
        let tmax = points
            .clone()
            .map(|p| p.0 + 1.0)
            .fold(r.storm_to_s, f64::max);
        let ymax = points.map(|p| p.1).fold(r.threshold_ms, f64::max).max(0.01) * 2.0;
        let ymin = (r.level_ms / 10.0).max(1e-3);
        let mut chart = ChartBuilder::on(area)
            .caption(
                "Admission latency by arrival second (storm shaded)",
                ("sans-serif", 24),
            )
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..tmax, (ymin..ymax).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("arrival time (s)")
            .y_desc("mean admission latency (ms, log)")
            .draw()?;
        let shade = RGBColor(230, 230, 230).filled();
        let window = [(r.storm_from_s, ymin), (r.storm_to_s, ymax)];
        chart.draw_series(std::iter::once(Rectangle::new(window, shade)))?;
        let threshold = [(0.0, r.threshold_ms), (tmax, r.threshold_ms)];
        chart
            .draw_series(LineSeries::new(threshold, BLACK.stroke_width(1)))?
            .label(format!("degraded above {:.1} ms", r.threshold_ms))
            .legend(swatch(BLACK, 1));
        for (i, (name, bins)) in series.iter().enumerate() {
            let c = palette(i);
            let line = bins.iter().map(|&(t, ms)| (t + 0.5, ms.max(ymin)));
            chart
                .draw_series(LineSeries::new(line, c.stroke_width(2)))?
                .label(name.replace('_', " "))
                .legend(swatch(c, 3));
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        Ok(())
    }
}

/// One stage's pinned blocks over time, one step line per run.
fn pinned_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    runs: &[(&str, &[Sample])],
    pick: fn(&Sample) -> u64,
) -> Res
where
    DB::ErrorType: 'static,
{
    let tmax = runs.iter().flat_map(|(_, s)| s.last().map(|x| x.t_s));
    let tmax = tmax.fold(0.0f64, f64::max).max(1.0);
    let ymax = runs.iter().flat_map(|(_, s)| s.iter().map(pick));
    let ymax = ymax.max().unwrap_or(0).max(1) as f64;
    let axes = Axes {
        caption,
        x_desc: "virtual time (s)",
        y_desc: "KV blocks pinned",
        y_label_area: 80,
    };
    let mut chart = axes.chart(area, 0f64..tmax, 0f64..ymax * 1.1)?;
    for (i, (name, samples)) in runs.iter().enumerate() {
        let c = palette(i);
        let steps = samples.windows(2).flat_map(|w| {
            let y = pick(&w[0]) as f64;
            [(w[0].t_s, y), (w[1].t_s, y)]
        });
        chart
            .draw_series(LineSeries::new(steps, c.stroke_width(2)))?
            .label(name.replace('_', " "))
            .legend(swatch(c, 3));
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    Ok(())
}

/// A legend's swatch: a short line in the series' colour.
pub(super) fn swatch(c: RGBColor, width: u32) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(width))
}

/// Series `i`'s points as markers of its colour and of one of four shapes (circle, triangle,
/// cross, square), the same shape in the legend, so series that coincide still show. `size`
/// is the circle's radius, `stroke` the outline width of the cross and the square.
pub(crate) fn markers<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    i: usize,
    points: impl Iterator<Item = (f64, f64)>,
    (size, stroke): (i32, u32),
    label: String,
) -> Res
where
    DB::ErrorType: 'static,
{
    let c = palette(i);
    let (r, big) = (size, size + 2);
    match i % 4 {
        0 => chart
            .draw_series(points.map(|p| Circle::new(p, r, c.filled())))?
            .label(label)
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, c.filled())),
        1 => chart
            .draw_series(points.map(|p| TriangleMarker::new(p, big, c.filled())))?
            .label(label)
            .legend(move |(x, y)| TriangleMarker::new((x + 10, y), 6, c.filled())),
        2 => chart
            .draw_series(points.map(|p| Cross::new(p, r + 1, c.stroke_width(stroke))))?
            .label(label)
            .legend(move |(x, y)| Cross::new((x + 10, y), 5, c.stroke_width(2))),
        _ => chart
            .draw_series(points.map(|p| {
                EmptyElement::at(p) + Rectangle::new([(-r, -r), (r, r)], c.stroke_width(stroke))
            }))?
            .label(label)
            .legend(move |(x, y)| {
                EmptyElement::at((x + 10, y))
                    + Rectangle::new([(-4, -4), (4, 4)], c.stroke_width(2))
            }),
    };
    Ok(())
}
