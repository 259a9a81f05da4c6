//! SVG charts of lab reports, for `meshwire lab plot`.
//!
//! Two inputs, told apart by their keys:
//!
//! - a scenario report (`meshwire lab run --json`, a `"scenario"` key): for each metric asked
//!   for, a grouped bar chart, x = case, one bar per policy, y = the metric;
//! - a sweep report (`meshwire lab sweep --json`, a `"sweep"` key): for each ratio it declares,
//!   the empirical CDF of that ratio over the sweep's cases, one curve per policy, x = the ratio
//!   to the floor on a log scale, y = the fraction of cases. A failed case (or a ratio of `null`,
//!   i.e. infinite) counts as infinitely bad: that policy's curve ends below 1 and its legend says
//!   how many failed.
//!
//! Charts are [`SIZE`] pixels, drawn by plotters' SVG backend (text as `<text>` elements, so no
//! font library is needed) and deterministic: the same input gives byte-identical SVG.
//!
//! ```no_run
//! use meshwire_lab::plot::PlotInput;
//!
//! let input = PlotInput::load("report.json".as_ref())?;
//! for chart in input.charts(&["goodput_mbit_per_s".to_string()], "report.json")? {
//!     println!("{}", chart.write_to("docs/plots".as_ref())?.display());
//! }
//! # Ok::<(), meshwire_lab::plot::PlotError>(())
//! ```

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Deserialize;

use crate::scenario::format_number;

/// Every chart's size in pixels (width, height).
pub const SIZE: (u32, u32) = (800, 480);

/// Distinct colours, one per policy in the order the report lists them (Tableau 10, less its
/// grey, which the floor line would be confused with).
const PALETTE: [RGBColor; 9] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

const FONT: &str = "sans-serif";

/// Why a report could not be plotted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlotError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not JSON.
    #[error("{path} is not JSON: {error}")]
    NotJson {
        /// The file.
        path: String,
        /// What the JSON reader said (in the message, so it is not also a separate cause).
        error: serde_json::Error,
    },
    /// The file is JSON but neither a scenario report nor a sweep report.
    #[error("{path} is not a scenario report (`meshwire lab run --json`) or a sweep report (`meshwire lab sweep --json`): {reason}")]
    Shape {
        /// The file.
        path: String,
        /// What is missing or wrong.
        reason: String,
    },
    /// A scenario report was given without any `--metric`.
    #[error("{path} is a report of scenario {scenario}: name the metrics to plot with --metric NAME; its metrics are {available}")]
    NoMetric {
        /// The file.
        path: String,
        /// The scenario.
        scenario: String,
        /// The metrics its results have, comma-separated.
        available: String,
    },
    /// No result of a scenario report has the metric asked for.
    #[error("{path}: no result of scenario {scenario} has the metric {metric:?}; its metrics are {available}")]
    UnknownMetric {
        /// The file.
        path: String,
        /// The scenario.
        scenario: String,
        /// The metric asked for.
        metric: String,
        /// The metrics its results have, comma-separated.
        available: String,
    },
    /// A sweep report declares no ratio, so there is nothing to draw.
    #[error("{path}: sweep {sweep} declares no ratios to plot")]
    NoRatios {
        /// The file.
        path: String,
        /// The sweep.
        sweep: String,
    },
    /// plotters failed to draw a chart.
    #[error("cannot draw {chart}: {reason}")]
    Render {
        /// The chart's file name.
        chart: String,
        /// What plotters said.
        reason: String,
    },
    /// A chart could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// What the OS said.
        source: std::io::Error,
    },
}

/// A report to plot.
#[derive(Debug, Clone, PartialEq)]
pub enum PlotInput {
    /// What `meshwire lab run --json` prints.
    Scenario(ScenarioReport),
    /// What `meshwire lab sweep --json` prints.
    Sweep(SweepReport),
}

/// The parts of a scenario report that the charts use (other keys are ignored).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ScenarioReport {
    /// The scenario's name.
    pub scenario: String,
    /// Every case under every policy.
    pub results: Vec<ScenarioResult>,
}

/// One case under one policy in a scenario report.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ScenarioResult {
    /// The case.
    pub case: String,
    /// The policy.
    pub policy: String,
    /// Metric name to value; `null` (a non-finite value) is drawn as "n/a".
    #[serde(default)]
    pub metrics: BTreeMap<String, Option<f64>>,
}

/// The parts of a sweep report that the charts use (other keys, such as `distributions` and
/// `worst`, are ignored: the curves are computed from the cases).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SweepReport {
    /// The sweep's name.
    pub sweep: String,
    /// The policies, in the order their colours are assigned.
    #[serde(default)]
    pub policies: Vec<String>,
    /// The ratios each case reports.
    pub ratios: Vec<RatioSpec>,
    /// The cases.
    pub cases: Vec<SweepCase>,
}

/// One ratio of a sweep: a metric over its floor.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RatioSpec {
    /// The ratio's name, the key in each result's `ratios`.
    pub name: String,
    /// The measured metric.
    #[serde(default)]
    pub metric: String,
    /// The metric it is divided by.
    #[serde(default)]
    pub floor: String,
}

/// One case of a sweep.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SweepCase {
    /// The case's name.
    #[serde(default)]
    pub name: String,
    /// One result per policy.
    #[serde(default)]
    pub results: Vec<SweepResult>,
}

/// One policy's result in one sweep case.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SweepResult {
    /// The policy.
    pub policy: String,
    /// Why the run failed, or `null`.
    #[serde(default)]
    pub failed: Option<String>,
    /// Ratio name to value; `null` means infinite.
    #[serde(default)]
    pub ratios: BTreeMap<String, Option<f64>>,
}

/// One drawn chart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chart {
    /// Its file name, `<scenario>-<metric>.svg` or `<sweep>-<ratio>.svg`.
    pub file_name: String,
    /// Its title.
    pub title: String,
    /// The SVG document.
    pub svg: String,
}

impl Chart {
    /// Writes the chart into `dir` (which must exist) and returns its path.
    pub fn write_to(&self, dir: &Path) -> Result<PathBuf, PlotError> {
        let path = dir.join(&self.file_name);
        std::fs::write(&path, &self.svg).map_err(|source| PlotError::Write {
            path: path.display().to_string(),
            source,
        })?;
        Ok(path)
    }
}

impl PlotInput {
    /// Reads and parses a report file.
    pub fn load(path: &Path) -> Result<Self, PlotError> {
        let display = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| PlotError::Io {
            path: display.clone(),
            source,
        })?;
        Self::parse(&text, &display)
    }

    /// Parses report text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, PlotError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|error| PlotError::NotJson {
                path: origin.to_string(),
                error,
            })?;
        let shape = |reason: String| PlotError::Shape {
            path: origin.to_string(),
            reason,
        };
        let serde_json::Value::Object(object) = &value else {
            return Err(shape("it is not a JSON object".into()));
        };
        if object.contains_key("sweep") {
            let report: SweepReport = serde_json::from_value(value)
                .map_err(|error| shape(format!("it has a \"sweep\" key, but {error}")))?;
            Ok(Self::Sweep(report))
        } else if object.contains_key("scenario") {
            let report: ScenarioReport = serde_json::from_value(value)
                .map_err(|error| shape(format!("it has a \"scenario\" key, but {error}")))?;
            Ok(Self::Scenario(report))
        } else {
            Err(shape(
                "it has neither a \"sweep\" key nor a \"scenario\" key".into(),
            ))
        }
    }

    /// Draws the input's charts: for a scenario report one per metric in `metrics` (at least one
    /// is required), for a sweep report one per ratio (`metrics` does not apply). `origin` names
    /// the input in errors.
    pub fn charts(&self, metrics: &[String], origin: &str) -> Result<Vec<Chart>, PlotError> {
        match self {
            Self::Scenario(report) => {
                if metrics.is_empty() {
                    return Err(PlotError::NoMetric {
                        path: origin.to_string(),
                        scenario: report.scenario.clone(),
                        available: report.available_metrics(),
                    });
                }
                let mut seen = Vec::new();
                let mut charts = Vec::new();
                for metric in metrics {
                    if !seen.contains(&metric) {
                        seen.push(metric);
                        charts.push(report.chart(metric, origin)?);
                    }
                }
                Ok(charts)
            }
            Self::Sweep(report) => {
                if report.ratios.is_empty() {
                    return Err(PlotError::NoRatios {
                        path: origin.to_string(),
                        sweep: report.sweep.clone(),
                    });
                }
                report
                    .ratios
                    .iter()
                    .map(|ratio| report.chart(ratio))
                    .collect()
            }
        }
    }
}

impl ScenarioReport {
    /// The metrics any result has, sorted and comma-separated ("none" if there are none).
    fn available_metrics(&self) -> String {
        let names: std::collections::BTreeSet<&str> = self
            .results
            .iter()
            .flat_map(|result| result.metrics.keys().map(String::as_str))
            .collect();
        if names.is_empty() {
            "none".into()
        } else {
            names.into_iter().collect::<Vec<_>>().join(", ")
        }
    }

    /// The grouped bar chart of `metric`: x = the cases that have it, one bar per policy.
    pub fn chart(&self, metric: &str, origin: &str) -> Result<Chart, PlotError> {
        let policies = unique(self.results.iter().map(|result| result.policy.as_str()));
        let mut cases: Vec<&str> = Vec::new();
        let mut values: BTreeMap<(usize, usize), Option<f64>> = BTreeMap::new();
        for result in &self.results {
            let Some(value) = result.metrics.get(metric) else {
                continue;
            };
            let case = match cases.iter().position(|case| *case == result.case) {
                Some(index) => index,
                None => {
                    cases.push(&result.case);
                    cases.len() - 1
                }
            };
            let policy = policies
                .iter()
                .position(|policy| *policy == result.policy)
                .unwrap_or_default();
            values
                .entry((case, policy))
                .or_insert(value.filter(|value| value.is_finite()));
        }
        if cases.is_empty() {
            return Err(PlotError::UnknownMetric {
                path: origin.to_string(),
                scenario: self.scenario.clone(),
                metric: metric.to_string(),
                available: self.available_metrics(),
            });
        }
        // Only the policies that have the metric somewhere get a slot; each keeps the colour of
        // its place among all the report's policies.
        let shown: Vec<usize> = (0..policies.len())
            .filter(|policy| values.keys().any(|(_, p)| p == policy))
            .collect();
        let file_name = format!("{}-{}.svg", file_part(&self.scenario), file_part(metric));
        let title = format!("{} / {}", self.scenario, metric);
        let svg = draw_bars(&BarChart {
            title: &title,
            metric,
            cases: &cases,
            policies: &policies,
            shown: &shown,
            values: &values,
        })
        .map_err(|reason| PlotError::Render {
            chart: file_name.clone(),
            reason,
        })?;
        Ok(Chart {
            file_name,
            title,
            svg,
        })
    }
}

impl SweepReport {
    /// The policies in colour order: those the report lists, then any others its results name.
    fn all_policies(&self) -> Vec<&str> {
        unique(
            self.policies.iter().map(String::as_str).chain(
                self.cases
                    .iter()
                    .flat_map(|case| case.results.iter().map(|result| result.policy.as_str())),
            ),
        )
    }

    /// The empirical CDF chart of `ratio` over the cases, one curve per policy.
    pub fn chart(&self, ratio: &RatioSpec) -> Result<Chart, PlotError> {
        let curves: Vec<Curve<'_>> = self
            .all_policies()
            .into_iter()
            .map(|policy| {
                let mut curve = Curve {
                    policy,
                    finite: Vec::new(),
                    failed: 0,
                    infinite: 0,
                };
                for result in self
                    .cases
                    .iter()
                    .flat_map(|case| &case.results)
                    .filter(|result| result.policy == policy)
                {
                    if result.failed.is_some() {
                        curve.failed += 1;
                        continue;
                    }
                    match result.ratios.get(&ratio.name) {
                        Some(Some(value)) if value.is_finite() => curve.finite.push(*value),
                        Some(_) => curve.infinite += 1,
                        None => {}
                    }
                }
                curve.finite.sort_by(f64::total_cmp);
                curve
            })
            .collect();
        let file_name = format!("{}-{}.svg", file_part(&self.sweep), file_part(&ratio.name));
        let title = format!("{} / {}", self.sweep, ratio.name);
        let x_desc = if ratio.metric.is_empty() || ratio.floor.is_empty() {
            "ratio to the floor (log scale)".to_string()
        } else {
            format!(
                "{} / {}: ratio to the floor (log scale)",
                ratio.metric, ratio.floor
            )
        };
        let svg = draw_cdf(&title, &x_desc, &curves).map_err(|reason| PlotError::Render {
            chart: file_name.clone(),
            reason,
        })?;
        Ok(Chart {
            file_name,
            title,
            svg,
        })
    }
}

/// One policy's values of one ratio.
struct Curve<'a> {
    policy: &'a str,
    /// The finite values, sorted.
    finite: Vec<f64>,
    /// Cases that failed.
    failed: usize,
    /// Cases that did not fail but whose ratio is infinite (`null`).
    infinite: usize,
}

impl Curve<'_> {
    fn cases(&self) -> usize {
        self.finite.len() + self.failed + self.infinite
    }

    fn legend(&self) -> String {
        if self.cases() == 0 {
            return format!("{} (no cases)", self.policy);
        }
        let mut legend = format!(
            "{} ({} cases, {} failed",
            self.policy,
            self.cases(),
            self.failed
        );
        if self.infinite > 0 {
            legend.push_str(&format!(", {} infinite", self.infinite));
        }
        legend.push(')');
        legend
    }

    /// The step function through the sorted values, from `x.start` at 0 to `x.end` at the
    /// fraction of cases with a finite value.
    /// Values left of the axis (a ratio of 0 on the log scale) step up at its start.
    fn steps(&self, x: &Range<f64>) -> Vec<(f64, f64)> {
        let cases = self.cases().max(1) as f64;
        let mut points = vec![(x.start, 0.0)];
        for (below, value) in self.finite.iter().enumerate() {
            let value = value.max(x.start);
            points.push((value, below as f64 / cases));
            points.push((value, (below + 1) as f64 / cases));
        }
        points.push((x.end, self.finite.len() as f64 / cases));
        points
    }
}

/// The distinct items in first-seen order.
fn unique<'a>(items: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// `name` made safe as part of a file name: anything but ASCII letters, digits, `-`, `_` and `.`
/// becomes `_`, so a name cannot leave the output directory.
fn file_part(name: &str) -> String {
    let part: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if part.is_empty() || part.chars().all(|c| c == '.') {
        part.replace('.', "_") + "_"
    } else {
        part
    }
}

fn colour(policy: usize) -> RGBColor {
    PALETTE[policy % PALETTE.len()]
}

/// An axis tick label: up to 3 decimals with trailing zeros cut, or in scientific notation when
/// that would lose the value (below 0.001) or be long (from a million on).
fn tick(value: f64) -> String {
    if value != 0.0 && !(1e-3..1e6).contains(&value.abs()) {
        return format!("{value:e}");
    }
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".into()
    } else {
        text.into()
    }
}

/// Ticks at the multiples of a 1-2-5 step that give about `target` of them in `range`.
fn linear_ticks(range: &Range<f64>, target: usize) -> Vec<f64> {
    let span = range.end - range.start;
    if span <= 0.0 || !span.is_finite() {
        return vec![range.start];
    }
    let raw = span / target.max(1) as f64;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|step| *step >= raw)
        .unwrap_or(10.0 * magnitude);
    let first = (range.start / step).ceil() as i64;
    let last = (range.end / step).floor() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

/// Ticks for a log axis: linear ones while the range spans less than a factor 5, then 1-2-5 (or
/// 1-to-9) multiples of the powers of ten, then powers of ten.
fn log_ticks(range: &Range<f64>) -> Vec<f64> {
    if range.end / range.start < 5.0 {
        return linear_ticks(range, 8);
    }
    let first = range.start.log10().floor() as i32;
    let last = range.end.log10().ceil() as i32;
    let decades = (range.end / range.start).log10().ceil().max(1.0) as usize;
    let multiples: &[f64] = if decades <= 1 {
        &[1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    } else if decades <= 3 {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0]
    };
    // Every power of ten up to 10 decades, then every k-th.
    let every = decades.div_ceil(10).max(1);
    (first..=last)
        .filter(|power| power.rem_euclid(every as i32) == 0)
        .flat_map(|power| multiples.iter().map(move |m| m * 10f64.powi(power)))
        .filter(|value| range.contains(value))
        .collect()
}

/// An f64 axis (linear or log) with the ticks chosen here rather than by plotters, formatted by
/// the chart's label formatter.
struct Ticked<R> {
    inner: R,
    ticks: Vec<f64>,
}

impl<R: Ranged<ValueType = f64>> Ranged for Ticked<R> {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        self.ticks.clone()
    }

    fn range(&self) -> Range<f64> {
        self.inner.range()
    }

    fn axis_pixel_range(&self, limit: (i32, i32)) -> Range<i32> {
        self.inner.axis_pixel_range(limit)
    }
}

fn linear_axis(range: Range<f64>, ticks: Vec<f64>) -> Ticked<RangedCoordf64> {
    Ticked {
        inner: range.into(),
        ticks,
    }
}

fn log_axis(range: Range<f64>, ticks: Vec<f64>) -> Ticked<LogCoord<f64>> {
    Ticked {
        inner: range.log_scale().into(),
        ticks,
    }
}

/// Draws the legend at `position` and writes the chart out.
fn finish<'a, X: Ranged, Y: Ranged>(
    context: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    root: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    position: SeriesLabelPosition,
) -> Result<(), String> {
    context
        .configure_series_labels()
        .position(position)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

fn err(error: impl std::fmt::Display) -> String {
    error.to_string()
}

struct BarChart<'a> {
    title: &'a str,
    metric: &'a str,
    cases: &'a [&'a str],
    /// All the report's policies (colour order).
    policies: &'a [&'a str],
    /// The indices into `policies` that get a bar.
    shown: &'a [usize],
    /// (case, policy) to value; `None` = non-finite.
    values: &'a BTreeMap<(usize, usize), Option<f64>>,
}

fn draw_bars(chart: &BarChart<'_>) -> Result<String, String> {
    let finite: Vec<f64> = chart.values.values().filter_map(|value| *value).collect();
    let low = finite.iter().copied().fold(0.0, f64::min);
    let high = finite.iter().copied().fold(0.0, f64::max);
    let (low, high) = if high > low {
        (low, high)
    } else {
        (low, low + 1.0)
    };
    // Headroom for the value labels and the legend.
    let span = high - low;
    let y = (if low < 0.0 { low - 0.08 * span } else { low })..(high + 0.25 * span);
    let y_ticks = linear_ticks(&y, 8);
    let cases = chart.cases.len();
    let x = 0.0..cases as f64;
    // Staggered case labels when they would not fit side by side (about 7 px per character).
    let longest = chart.cases.iter().map(|case| case.len()).max().unwrap_or(0);
    let stagger = longest as f64 * 7.0 > 680.0 / cases as f64;

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut context = ChartBuilder::on(&root)
            .caption(chart.title, (FONT, 22))
            .margin(12)
            .x_label_area_size(if stagger { 62 } else { 46 })
            .y_label_area_size(70)
            .build_cartesian_2d(
                linear_axis(x.clone(), Vec::new()),
                linear_axis(y.clone(), y_ticks),
            )
            .map_err(err)?;
        context
            .configure_mesh()
            .disable_x_mesh()
            .x_desc("case")
            .y_desc(chart.metric)
            .y_label_formatter(&|value| tick(*value))
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 15))
            .light_line_style(WHITE)
            .draw()
            .map_err(err)?;

        let group = 0.8;
        let width = group / chart.shown.len() as f64;
        let bar_pixels = {
            let (left, _) = context.backend_coord(&(0.0, 0.0));
            let (right, _) = context.backend_coord(&(width, 0.0));
            right - left
        };
        let label_style = TextStyle::from((FONT, 12).into_font()).color(&BLACK);
        for (slot, &policy) in chart.shown.iter().enumerate() {
            let fill = colour(policy);
            let bars: Vec<(f64, f64, f64)> = (0..cases)
                .filter_map(|case| {
                    let left = case as f64 + (1.0 - group) / 2.0 + slot as f64 * width;
                    chart
                        .values
                        .get(&(case, policy))
                        .copied()
                        .flatten()
                        .map(|value| (left + 0.05 * width, left + 0.95 * width, value))
                })
                .collect();
            context
                .draw_series(bars.iter().map(|&(left, right, value)| {
                    Rectangle::new([(left, 0.0), (right, value)], fill.filled())
                }))
                .map_err(err)?
                .label(chart.policies[policy])
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], fill.filled()));
            let mut labels = Vec::new();
            for case in 0..cases {
                let centre = case as f64 + (1.0 - group) / 2.0 + (slot as f64 + 0.5) * width;
                match chart.values.get(&(case, policy)) {
                    Some(Some(value)) if bar_pixels >= 30 => {
                        let vertical = if *value < 0.0 {
                            VPos::Top
                        } else {
                            VPos::Bottom
                        };
                        labels.push(Text::new(
                            format_number(*value),
                            (centre, *value),
                            label_style.pos(Pos::new(HPos::Center, vertical)),
                        ));
                    }
                    Some(None) => labels.push(Text::new(
                        "n/a".to_string(),
                        (centre, 0.0),
                        label_style.pos(Pos::new(HPos::Center, VPos::Bottom)),
                    )),
                    _ => {}
                }
            }
            context.draw_series(labels).map_err(err)?;
        }
        // The case names under their groups.
        let case_style = TextStyle::from((FONT, 13).into_font())
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Top));
        for (index, case) in chart.cases.iter().enumerate() {
            let (px, py) = context.backend_coord(&(index as f64 + 0.5, y.start));
            let offset = if stagger && index % 2 == 1 { 22 } else { 6 };
            root.draw(&Text::new(*case, (px, py + offset), case_style.clone()))
                .map_err(err)?;
        }
        finish(&mut context, &root, SeriesLabelPosition::UpperRight)?;
    }
    Ok(svg)
}

fn draw_cdf(title: &str, x_desc: &str, curves: &[Curve<'_>]) -> Result<String, String> {
    // The log axis spans the positive values and 1 (the floor).
    let positive = curves
        .iter()
        .flat_map(|curve| curve.finite.iter().copied())
        .filter(|value| *value > 0.0);
    let low = positive.clone().fold(1.0, f64::min);
    let high = positive.fold(1.0, f64::max).max(low * 1.1);
    // A little room either side, in log space, so the floor line is not on the axis.
    let span = (high / low).ln();
    let x = (low * (-0.03 * span).exp()).max(f64::MIN_POSITIVE)
        ..(high * (0.05 * span).exp()).min(f64::MAX);
    let x_ticks = log_ticks(&x);
    let y = 0.0..1.05;

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut context = ChartBuilder::on(&root)
            .caption(title, (FONT, 22))
            .margin(12)
            .x_label_area_size(46)
            .y_label_area_size(60)
            .build_cartesian_2d(
                log_axis(x.clone(), x_ticks),
                linear_axis(y, vec![0.0, 0.25, 0.5, 0.75, 1.0]),
            )
            .map_err(err)?;
        context
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc("fraction of cases")
            .x_label_formatter(&|value| tick(*value))
            .y_label_formatter(&|value| tick(*value))
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 15))
            .light_line_style(WHITE)
            .draw()
            .map_err(err)?;
        context
            .draw_series(DashedLineSeries::new(
                [(1.0, 0.0), (1.0, 1.05)],
                6,
                4,
                BLACK.stroke_width(1),
            ))
            .map_err(err)?
            .label("floor (ratio 1)")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 14, y)], BLACK.stroke_width(1)));
        for (index, curve) in curves.iter().enumerate() {
            let stroke = colour(index).stroke_width(2);
            context
                .draw_series(LineSeries::new(curve.steps(&x), stroke))
                .map_err(err)?
                .label(curve.legend())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], stroke));
        }
        finish(&mut context, &root, SeriesLabelPosition::LowerRight)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests;
