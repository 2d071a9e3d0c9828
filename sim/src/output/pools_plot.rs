//! `pools`, a prefill/decode graph's only: each pool's KV blocks in use and its queue over time,
//! one line per run, so a planner sees which pool saturates and when (the summary's `pools`
//! gives each pool's totals; `pools.csv` the samples drawn here).

use plotters::coord::Shift;
use plotters::prelude::*;

use super::plots::{label, legend, palette, small_panel, swatch, Charts, Res};
use crate::record::PoolSample;

/// Pools drawn, at most: more would make panels too small to read (`pools.csv` has them all).
const POOLS_DRAWN_MAX: usize = 6;

type Pick = fn(&PoolSample) -> u64;

/// The two columns: caption and what each panel draws.
const COLUMNS: [(&str, Pick); 2] = [
    ("KV blocks in use", |s| s.kv_blocks),
    ("requests queued", |s| s.queue),
];

impl Charts<'_> {
    pub(super) fn pools<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Res
    where
        DB::ErrorType: 'static,
    {
        let pools = &self.report.counterfactual.pools;
        let shown = pools.len().min(POOLS_DRAWN_MAX);
        let (top, rest) = area.split_vertically(70);
        label(
            &top,
            "Each pool over time: KV blocks in use and queue",
            24,
            (20, 8),
        )?;
        let more = match pools.len() > shown {
            true => format!(
                "; the first {shown} of {} pools (pools.csv has all)",
                pools.len()
            ),
            false => String::new(),
        };
        let note = format!(
            "x: virtual time (s); summed over the pool's replicas, one line per run, steps between samples{more}"
        );
        label(&top, &note, 16, (20, 40))?;
        let names: Vec<&str> = std::iter::once(&self.report.counterfactual)
            .chain(&self.report.policies)
            .map(|s| s.policy.as_str())
            .collect();
        let panels = rest.split_evenly((shown.max(1), COLUMNS.len()));
        for (k, panel) in panels.iter().enumerate() {
            let (pool, (what, pick)) = (k / COLUMNS.len(), COLUMNS[k % COLUMNS.len()]);
            let p = &pools[pool];
            let caption = format!("{} ({}, {} replicas): {what}", p.name, p.role, p.replicas);
            let runs: Vec<(&str, Vec<(f64, u64)>)> = (names.iter().zip(self.extras))
                .map(|(n, e)| {
                    let mine = e.pool_timeseries.iter().filter(|s| s.pool as usize == pool);
                    (*n, mine.map(|s| (s.t_s, pick(s))).collect())
                })
                .collect();
            pool_panel(panel, &caption, &runs, k == 0)?;
        }
        Ok(())
    }
}

/// One pool's gauge over time, one step line per run; the legend on the first panel only (the
/// runs are the same in every one).
fn pool_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    runs: &[(&str, Vec<(f64, u64)>)],
    with_legend: bool,
) -> Res
where
    DB::ErrorType: 'static,
{
    let points = runs.iter().flat_map(|(_, s)| s.iter());
    let tmax = points.clone().map(|p| p.0).fold(0.0f64, f64::max).max(1.0);
    let ymax = points.map(|p| p.1).max().unwrap_or(0).max(1) as f64 * 1.1;
    let mut chart = small_panel(area, caption, 0f64..tmax, 0f64..ymax)?;
    for (i, (name, samples)) in runs.iter().enumerate() {
        let c = palette(i);
        let steps = samples.windows(2).flat_map(|w| {
            let y = w[0].1 as f64;
            [(w[0].0, y), (w[1].0, y)]
        });
        chart
            .draw_series(LineSeries::new(steps, c.stroke_width(2)))?
            .label(name.replace('_', " "))
            .legend(swatch(c, 3));
    }
    match with_legend {
        true => legend(&mut chart, SeriesLabelPosition::UpperRight),
        false => Ok(()),
    }
}
