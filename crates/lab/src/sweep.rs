//! Sweeps: an experiment run over randomly drawn cases, each result judged against its physical
//! floor.
//!
//! A sweep file (`scenarios/sweeps/*.toml`, format in `docs/scenarios.md`) names an experiment
//! kind and workload and gives, for the link and each parameter, a fixed value or a spec to draw
//! from: `{ range = [lo, hi] }` (uniform; integers when both bounds are, `scale = "log"` for
//! log-uniform), `{ choose = [a, b, ...] }` (one of them, each itself a value or a spec) or
//! `{ repeat = [min, max], each = SPEC }` (a list of `min..=max` independent draws). Any other
//! table is a table of specs, any array an array of specs.
//!
//! Case `K` is drawn from its own generator seeded by the sweep seed and `K`, so a case does not
//! depend on how many are drawn, and the same seed gives the same cases and, the lab being
//! deterministic in virtual time, byte-identical reports. Each case becomes an ordinary one-case
//! scenario file ([`Sweep::case_text`], what `meshwire lab sweep --print-case K` prints), parsed
//! and checked like any other, and runs under every policy. The experiment's [`Floor`]s turn its
//! metrics into ratios; a case that fails (an error, a panic, or a result that misses one of the
//! experiment's [`Require`](crate::experiments::Require)ments, such as delivering everything) is
//! kept, as a failure with its reason, and counts as infinitely bad in the distributions.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::experiments::{self, Experiment, Trial};
use crate::lab::derive_seed;
use crate::scenario::{format_number, ScenarioError, ScenarioFile};
use crate::stats::{percentile, round_metric, Metrics};
use crate::Mode;

/// How many of the worst cases a report lists per policy and ratio.
pub const WORST_PER_RATIO: usize = 3;

/// Why a sweep could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SweepError {
    /// The file could not be read.
    #[error("cannot read sweep {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has an unknown or missing key.
    #[error("sweep {path} is invalid: {}", error.to_string().trim_end())]
    Syntax {
        /// The file.
        path: String,
        /// What the TOML reader said.
        error: Box<toml::de::Error>,
    },
    /// A field's spec or value is invalid.
    #[error("sweep {path}, field {field}: {reason}")]
    Field {
        /// The file.
        path: String,
        /// The field, e.g. `link.loss` or `params.paths[].rate_packets_per_s`.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The file is not a valid sweep for another reason.
    #[error("sweep {path} is invalid: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// A sweep file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepFile {
    /// Short name, printed in reports and used for plot file names.
    pub name: String,
    /// One line saying what the sweep asks.
    pub description: String,
    /// The experiment kind.
    pub kind: String,
    /// The experiment's workload every case runs.
    pub workload: String,
    /// Default seed (`--seed` overrides).
    pub seed: u64,
    /// Default number of cases (`--cases` overrides).
    pub cases: usize,
    /// Policies compared on every case.
    pub policies: Vec<String>,
    /// Each case's virtual time limit in seconds.
    pub duration_s: f64,
    /// The case link's fields: values or specs.
    pub link: toml::Table,
    /// The workload's parameters: values or specs.
    #[serde(default)]
    pub params: toml::Table,
}

/// A loaded, checked sweep.
#[derive(Debug, Clone)]
pub struct Sweep {
    file: SweepFile,
    origin: String,
    experiment: &'static Experiment,
}

/// Which value a spec takes when a case is built.
enum Pick<'a> {
    /// Drawn from the generator.
    Random(&'a mut SmallRng),
    /// Every spec takes its first option (lower bound, first choice, shortest list) except the
    /// one at `field`, which takes option `which`.
    Corner { field: &'a str, which: usize },
}

/// The kinds of spec a table can be.
const SPEC_KEYS: [&str; 3] = ["range", "choose", "repeat"];

/// A spec's kind, to name its options in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SpecKind {
    Range,
    Choose,
    Repeat,
}

impl SpecKind {
    fn option(self, which: usize) -> String {
        match (self, which) {
            (Self::Range, 0) => "its lower bound".into(),
            (Self::Range, _) => "its upper bound".into(),
            (Self::Choose, which) => format!("choice {which}"),
            (Self::Repeat, 0) => "its shortest list".into(),
            (Self::Repeat, _) => "its longest list".into(),
        }
    }
}

impl Sweep {
    /// Reads and checks a sweep file.
    pub fn load(path: &Path) -> Result<Self, SweepError> {
        let display = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| SweepError::Io {
            path: display.clone(),
            source,
        })?;
        Self::parse(&text, &display)
    }

    /// Parses sweep text; `origin` names it in errors. Every spec is checked, then every one of
    /// its extremes (both bounds of a range, each choice, the shortest and longest list) is built
    /// into a case with the other specs at their first option and checked like a scenario, so a
    /// rate of 0 or a loss of 1 anywhere in a range is refused here, naming the field.
    pub fn parse(text: &str, origin: &str) -> Result<Self, SweepError> {
        let invalid = |reason: String| SweepError::Invalid {
            path: origin.to_string(),
            reason,
        };
        let file: SweepFile = toml::from_str(text).map_err(|error| SweepError::Syntax {
            path: origin.to_string(),
            error: Box::new(error),
        })?;
        let experiment = experiments::find(&file.kind).ok_or_else(|| {
            invalid(format!(
                "unknown kind {:?}; the kinds are {}",
                file.kind,
                experiments::kinds().join(", ")
            ))
        })?;
        if experiment.floors.is_empty() {
            return Err(invalid(format!(
                "kind {} has no physical floor to sweep against",
                file.kind
            )));
        }
        if file.cases == 0 {
            return Err(invalid("cases must be at least 1".into()));
        }
        if !(file.duration_s.is_finite() && file.duration_s > 0.0) {
            return Err(invalid("duration_s must be positive".into()));
        }
        let sweep = Self {
            file,
            origin: origin.to_string(),
            experiment,
        };
        let mut options = Vec::new();
        for (section, table) in [("link", &sweep.file.link), ("params", &sweep.file.params)] {
            for (key, value) in table {
                spec_options(&format!("{section}.{key}"), value, &mut options)
                    .map_err(|(field, reason)| sweep.field_error(field, reason))?;
            }
        }
        // The case with every spec at its first option; if it fails, the spec whose other options
        // pass is the one to blame. Then each option of each spec.
        if let Err(reason) = sweep.corner_case("", 0) {
            let culprit = options.iter().find(|(field, count, _)| {
                (1..*count).any(|which| sweep.corner_case(field, which).is_ok())
            });
            return Err(match culprit {
                Some((field, _, kind)) => {
                    sweep.field_error(field.clone(), format!("{}: {reason}", kind.option(0)))
                }
                None => invalid(format!("with every spec at its first option: {reason}")),
            });
        }
        for (field, count, kind) in &options {
            for which in 1..*count {
                sweep.corner_case(field, which).map_err(|reason| {
                    sweep.field_error(field.clone(), format!("{}: {reason}", kind.option(which)))
                })?;
            }
        }
        Ok(sweep)
    }

    fn field_error(&self, field: String, reason: String) -> SweepError {
        SweepError::Field {
            path: self.origin.clone(),
            field,
            reason,
        }
    }

    /// Builds and checks the case where `field` takes option `which` and every other spec its
    /// first; the reason it is not a valid scenario, if it is not.
    fn corner_case(&self, field: &str, which: usize) -> Result<(), String> {
        let text = self.build(0, &mut Pick::Corner { field, which });
        ScenarioFile::parse(&text, &self.origin)
            .map(drop)
            .map_err(|error| match error {
                ScenarioError::Invalid { reason, .. } => reason,
                ScenarioError::Params { error, .. } => error.to_string().trim_end().into(),
                other => other.to_string(),
            })
    }

    /// The file as written.
    pub fn file(&self) -> &SweepFile {
        &self.file
    }

    /// The experiment it sweeps.
    pub fn experiment(&self) -> &'static Experiment {
        self.experiment
    }

    /// Case `index`'s run seed under sweep seed `seed` (48 bits, so scenario files can hold it).
    pub fn case_seed(&self, seed: u64, index: usize) -> u64 {
        derive_seed(seed, &self.file.name, index as u64) >> 16
    }

    /// Case `index` under sweep seed `seed` as an ordinary one-case scenario file.
    pub fn case_text(&self, seed: u64, index: usize) -> String {
        let mut rng = SmallRng::seed_from_u64(self.case_seed(seed, index) ^ 0x5eed);
        let mut pick = Pick::Random(&mut rng);
        self.build_with_seed(index, self.case_seed(seed, index), seed, &mut pick)
    }

    fn build(&self, index: usize, pick: &mut Pick<'_>) -> String {
        self.build_with_seed(index, self.file.seed, self.file.seed, pick)
    }

    fn build_with_seed(
        &self,
        index: usize,
        case_seed: u64,
        sweep_seed: u64,
        pick: &mut Pick<'_>,
    ) -> String {
        let file = &self.file;
        let mut case = toml::Table::new();
        case.insert("name".into(), format!("case-{index}").into());
        case.insert("workload".into(), file.workload.clone().into());
        case.insert("duration_s".into(), file.duration_s.into());
        for (section, table) in [("link", &file.link), ("params", &file.params)] {
            let drawn: toml::Table = table
                .iter()
                .map(|(key, value)| {
                    let field = format!("{section}.{key}");
                    (key.clone(), draw(&field, value, pick))
                })
                .collect();
            case.insert(section.into(), toml::Value::Table(drawn));
        }
        let mut scenario = toml::Table::new();
        scenario.insert("name".into(), format!("{}-case-{index}", file.name).into());
        scenario.insert(
            "description".into(),
            format!(
                "case {index} of sweep {} (seed {sweep_seed}): {}",
                file.name, file.description
            )
            .into(),
        );
        scenario.insert("kind".into(), file.kind.clone().into());
        scenario.insert("seed".into(), toml::Value::Integer(case_seed as i64));
        scenario.insert(
            "policies".into(),
            toml::Value::Array(file.policies.iter().cloned().map(Into::into).collect()),
        );
        scenario.insert("case".into(), toml::Value::Array(vec![case.into()]));
        toml::to_string(&scenario).unwrap_or_default()
    }

    /// Runs `cases` cases drawn from `seed` under every policy. `progress` hears each trial as
    /// it runs and the lab time elapsed in it.
    pub fn run(
        &self,
        seed: u64,
        cases: usize,
        mut progress: impl FnMut(&SweepProgress<'_>),
    ) -> SweepReport {
        let experiment = self.experiment;
        let total = cases * self.file.policies.len();
        let mut runs = Vec::with_capacity(cases);
        for index in 0..cases {
            let text = self.case_text(seed, index);
            let scenario = ScenarioFile::parse(&text, &self.origin);
            let case_seed = self.case_seed(seed, index);
            let mut results = Vec::new();
            let mut drawn = CaseRun {
                index,
                name: format!("case-{index}"),
                seed: case_seed,
                link: serde_json::Value::Null,
                params: serde_json::Value::Null,
                results: Vec::new(),
            };
            for policy in &self.file.policies {
                let label = format!("case-{index} / {policy}");
                let done = index * self.file.policies.len() + results.len();
                let outcome = match &scenario {
                    Err(error) => Err(error.to_string()),
                    Ok(scenario) => {
                        let case = &scenario.cases[0];
                        drawn.link = serde_json::to_value(case.link).unwrap_or_default();
                        drawn.params = serde_json::to_value(&case.params).unwrap_or_default();
                        let trial = Trial {
                            scenario: &scenario.name,
                            case,
                            seed: case_seed,
                            policy,
                            mode: Mode::Virtual,
                        };
                        let mut tick = |elapsed: Duration| {
                            progress(&SweepProgress {
                                done,
                                total,
                                trial: &label,
                                elapsed,
                            })
                        };
                        run_trial(experiment, &trial, &mut tick)
                    }
                };
                results.push(PolicyRun::new(experiment, policy, outcome));
            }
            drawn.results = results;
            runs.push(drawn);
        }
        progress(&SweepProgress {
            done: total,
            total,
            trial: "",
            elapsed: Duration::ZERO,
        });
        SweepReport::new(self, seed, runs)
    }
}

/// Runs one trial, turning an error or a panic into a failure reason.
fn run_trial(
    experiment: &Experiment,
    trial: &Trial<'_>,
    tick: &mut dyn FnMut(Duration),
) -> Result<Metrics, String> {
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        (experiment.run)(trial, tick)
    }));
    match run {
        Ok(Ok(metrics)) => Ok(metrics),
        Ok(Err(error)) => Err(error_chain(&error)),
        Err(panic) => Err(format!(
            "panicked: {}",
            panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)")
        )),
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Where a sweep is, for progress displays.
#[derive(Debug, Clone, Copy)]
pub struct SweepProgress<'a> {
    /// Trials finished.
    pub done: usize,
    /// Trials in the sweep (cases × policies).
    pub total: usize,
    /// The running trial, `case-K / policy`; empty when the sweep is done.
    pub trial: &'a str,
    /// Lab time elapsed in the running trial.
    pub elapsed: Duration,
}

/// Collects every spec's field and option count, or the first invalid spec.
fn spec_options(
    field: &str,
    value: &toml::Value,
    out: &mut Vec<(String, usize, SpecKind)>,
) -> Result<(), (String, String)> {
    let error = |reason: String| Err((field.to_string(), reason));
    match value {
        toml::Value::Table(table) if SPEC_KEYS.iter().any(|key| table.contains_key(*key)) => {
            let kinds: Vec<_> = SPEC_KEYS
                .iter()
                .filter(|key| table.contains_key(**key))
                .collect();
            if kinds.len() > 1 {
                return error("give one of range, choose or repeat".into());
            }
            match *kinds[0] {
                "range" => {
                    check_keys(field, table, &["range", "scale"])?;
                    range_bounds(table).map_err(|reason| (field.to_string(), reason))?;
                    out.push((field.to_string(), 2, SpecKind::Range));
                }
                "choose" => {
                    check_keys(field, table, &["choose"])?;
                    let Some(toml::Value::Array(options)) = table.get("choose") else {
                        return error("choose takes an array of values".into());
                    };
                    if options.is_empty() {
                        return error("choose is empty".into());
                    }
                    out.push((field.to_string(), options.len(), SpecKind::Choose));
                    for (index, option) in options.iter().enumerate() {
                        spec_options(&format!("{field}[{index}]"), option, out)?;
                    }
                }
                _ => {
                    check_keys(field, table, &["repeat", "each"])?;
                    repeat_bounds(table).map_err(|reason| (field.to_string(), reason))?;
                    let Some(each) = table.get("each") else {
                        return error("repeat needs `each`, the spec of one element".into());
                    };
                    out.push((field.to_string(), 2, SpecKind::Repeat));
                    spec_options(&format!("{field}[]"), each, out)?;
                }
            }
            Ok(())
        }
        toml::Value::Table(table) => table
            .iter()
            .try_for_each(|(key, value)| spec_options(&format!("{field}.{key}"), value, out)),
        toml::Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(index, item)| spec_options(&format!("{field}[{index}]"), item, out)),
        _ => Ok(()),
    }
}

fn check_keys(field: &str, table: &toml::Table, allowed: &[&str]) -> Result<(), (String, String)> {
    match table.keys().find(|key| !allowed.contains(&key.as_str())) {
        Some(key) => Err((
            field.to_string(),
            format!(
                "unknown key {key:?} in a spec; this spec takes {}",
                allowed.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

/// A range's bounds: integers when both are, floats otherwise.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bounds {
    Integer(i64, i64),
    Float(f64, f64),
}

fn range_bounds(table: &toml::Table) -> Result<(Bounds, bool), String> {
    let log = match table.get("scale") {
        None => false,
        Some(toml::Value::String(scale)) if scale == "linear" => false,
        Some(toml::Value::String(scale)) if scale == "log" => true,
        Some(other) => return Err(format!("scale is \"linear\" or \"log\", not {other}")),
    };
    let bounds = match table.get("range") {
        Some(toml::Value::Array(pair)) if pair.len() == 2 => match (&pair[0], &pair[1]) {
            (toml::Value::Integer(lo), toml::Value::Integer(hi)) => Bounds::Integer(*lo, *hi),
            (lo, hi) => match (number(lo), number(hi)) {
                (Some(lo), Some(hi)) => Bounds::Float(lo, hi),
                _ => return Err("range takes two numbers, [lo, hi]".into()),
            },
        },
        _ => return Err("range takes two numbers, [lo, hi]".into()),
    };
    let (lo, hi) = match bounds {
        Bounds::Integer(lo, hi) => (lo as f64, hi as f64),
        Bounds::Float(lo, hi) => (lo, hi),
    };
    if !(lo.is_finite() && hi.is_finite()) {
        return Err("range bounds must be finite".into());
    }
    if lo > hi {
        return Err(format!(
            "range [{lo}, {hi}] is empty: its lower bound is above its upper"
        ));
    }
    if log && lo <= 0.0 {
        return Err(format!(
            "a log-scale range needs a positive lower bound, not {lo}"
        ));
    }
    Ok((bounds, log))
}

fn repeat_bounds(table: &toml::Table) -> Result<(usize, usize), String> {
    match table.get("repeat") {
        Some(toml::Value::Array(pair)) if pair.len() == 2 => match (&pair[0], &pair[1]) {
            (toml::Value::Integer(lo), toml::Value::Integer(hi)) if 0 <= *lo && lo <= hi => {
                Ok((*lo as usize, *hi as usize))
            }
            _ => Err("repeat takes two integers [min, max] with 0 <= min <= max".into()),
        },
        _ => Err("repeat takes two integers [min, max] with 0 <= min <= max".into()),
    }
}

fn number(value: &toml::Value) -> Option<f64> {
    match value {
        toml::Value::Integer(number) => Some(*number as f64),
        toml::Value::Float(number) => Some(*number),
        _ => None,
    }
}

/// Rounds a drawn float to 4 significant digits, so printed cases stay readable.
fn round_drawn(value: f64) -> f64 {
    if value == 0.0 || !value.is_finite() {
        return value;
    }
    let digits = 4 - value.abs().log10().ceil() as i32;
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

/// The value `spec` takes under `pick`. Specs were checked at load, so an invalid one cannot
/// reach here; if one did, it is passed through as written and the scenario check refuses it.
fn draw(field: &str, spec: &toml::Value, pick: &mut Pick<'_>) -> toml::Value {
    // Which option this spec takes when building a corner case, and whether the target field
    // lies inside it (then the enclosing choice must lead there).
    let corner = |pick: &Pick<'_>, options: usize| -> usize {
        match pick {
            Pick::Corner {
                field: target,
                which,
            } if *target == field => (*which).min(options - 1),
            Pick::Corner { field: target, .. } => (0..options)
                .find(|index| target.starts_with(&format!("{field}[{index}]")))
                .unwrap_or(0),
            Pick::Random(_) => 0,
        }
    };
    match spec {
        toml::Value::Table(table) if table.contains_key("range") => {
            let Ok((bounds, log)) = range_bounds(table) else {
                return spec.clone();
            };
            let unit: f64 = match pick {
                Pick::Random(rng) => rng.random::<f64>(),
                Pick::Corner { .. } => corner(pick, 2) as f64,
            };
            match bounds {
                Bounds::Integer(lo, hi) => {
                    let value = if log {
                        let (lo_ln, hi_ln) = ((lo as f64).ln(), (hi as f64 + 1.0).ln());
                        (lo_ln + unit * (hi_ln - lo_ln)).exp().floor() as i64
                    } else {
                        lo + (unit * (hi - lo + 1) as f64).floor() as i64
                    };
                    toml::Value::Integer(value.clamp(lo, hi))
                }
                Bounds::Float(lo, hi) => {
                    let value = if log {
                        (lo.ln() + unit * (hi.ln() - lo.ln())).exp()
                    } else {
                        lo + unit * (hi - lo)
                    };
                    toml::Value::Float(round_drawn(value).clamp(lo, hi))
                }
            }
        }
        toml::Value::Table(table) if table.contains_key("choose") => {
            let Some(toml::Value::Array(options)) = table.get("choose") else {
                return spec.clone();
            };
            if options.is_empty() {
                return spec.clone();
            }
            let index = match pick {
                Pick::Random(rng) => rng.random_range(0..options.len()),
                Pick::Corner { .. } => corner(pick, options.len()),
            };
            draw(&format!("{field}[{index}]"), &options[index], pick)
        }
        toml::Value::Table(table) if table.contains_key("repeat") => {
            let (Ok((lo, hi)), Some(each)) = (repeat_bounds(table), table.get("each")) else {
                return spec.clone();
            };
            let length = match pick {
                Pick::Random(rng) => rng.random_range(lo..=hi),
                Pick::Corner { field: target, .. } if *target == field => [lo, hi][corner(pick, 2)],
                // A field inside the list needs at least one element to be checked.
                Pick::Corner { field: target, .. } if target.starts_with(&format!("{field}[]")) => {
                    lo.max(1)
                }
                Pick::Corner { .. } => lo,
            };
            let element = format!("{field}[]");
            toml::Value::Array((0..length).map(|_| draw(&element, each, pick)).collect())
        }
        toml::Value::Table(table) => toml::Value::Table(
            table
                .iter()
                .map(|(key, value)| (key.clone(), draw(&format!("{field}.{key}"), value, pick)))
                .collect(),
        ),
        toml::Value::Array(items) => toml::Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(index, item)| draw(&format!("{field}[{index}]"), item, pick))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A floor as reports name it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RatioName {
    /// The ratio's name.
    pub name: String,
    /// The measured metric.
    pub metric: String,
    /// The floor's metric.
    pub floor: String,
}

/// One case of a sweep: what was drawn and what every policy did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaseRun {
    /// The case's index under the seed.
    pub index: usize,
    /// `case-K`.
    pub name: String,
    /// The seed its trials ran with.
    pub seed: u64,
    /// The drawn link.
    pub link: serde_json::Value,
    /// The drawn parameters.
    pub params: serde_json::Value,
    /// Per policy, in the sweep's order.
    pub results: Vec<PolicyRun>,
}

/// One policy on one case.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyRun {
    /// The policy.
    pub policy: String,
    /// Why the trial failed, if it did.
    pub failed: Option<String>,
    /// Its metrics (empty when it did not finish).
    pub metrics: Metrics,
    /// Each floor's ratio, metric over floor.
    pub ratios: BTreeMap<String, f64>,
}

impl PolicyRun {
    /// A trial's outcome; one that misses a requirement keeps its metrics but fails, without
    /// ratios.
    fn new(experiment: &Experiment, policy: &str, outcome: Result<Metrics, String>) -> Self {
        let (failed, metrics) = match outcome {
            Ok(metrics) => (
                experiment
                    .requires
                    .iter()
                    .find_map(|require| require.missed(&metrics)),
                metrics,
            ),
            Err(reason) => (Some(reason), Metrics::new()),
        };
        let ratios = match failed {
            Some(_) => BTreeMap::new(),
            None => experiment
                .floors
                .iter()
                .filter_map(|floor| {
                    Some((floor.name.to_string(), round_metric(floor.ratio(&metrics)?)))
                })
                .collect(),
        };
        Self {
            policy: policy.to_string(),
            failed,
            metrics,
            ratios,
        }
    }
}

/// A ratio's distribution over a sweep's cases for one policy. Failed cases count as infinitely
/// bad, so a statistic they reach is `None` (`null` in JSON).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Distribution {
    /// The policy.
    pub policy: String,
    /// The ratio.
    pub ratio: String,
    /// Cases counted (with a ratio, or failed).
    pub cases: usize,
    /// Of which failed.
    pub failed: usize,
    /// Smallest.
    pub min: Option<f64>,
    /// 10th percentile.
    pub p10: Option<f64>,
    /// Median.
    pub median: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// Largest.
    pub max: Option<f64>,
}

/// One of the worst cases of a policy and ratio.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Worst {
    /// The policy.
    pub policy: String,
    /// The ratio.
    pub ratio: String,
    /// The case's index (`--print-case` prints it as a scenario).
    pub case: usize,
    /// The ratio, `None` when the case failed.
    pub value: Option<f64>,
}

/// A result below its floor by more than the tick: a floor or measurement bug.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BelowFloor {
    /// The case.
    pub case: usize,
    /// The policy.
    pub policy: String,
    /// The ratio.
    pub ratio: String,
    /// The measured metric.
    pub metric: f64,
    /// Its floor.
    pub floor: f64,
}

/// What `meshwire lab sweep --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepReport {
    /// The sweep's name.
    pub sweep: String,
    /// The experiment kind.
    pub kind: String,
    /// The workload.
    pub workload: String,
    /// The seed the cases were drawn from.
    pub seed: u64,
    /// The policies, in order.
    pub policies: Vec<String>,
    /// The floors, as ratios.
    pub ratios: Vec<RatioName>,
    /// Every case.
    pub cases: Vec<CaseRun>,
    /// Per policy and ratio, the distribution over cases.
    pub distributions: Vec<Distribution>,
    /// Per policy and ratio, the worst cases, worst first.
    pub worst: Vec<Worst>,
    /// Results that beat their floor (there should be none).
    pub below_floor: Vec<BelowFloor>,
}

impl SweepReport {
    fn new(sweep: &Sweep, seed: u64, cases: Vec<CaseRun>) -> Self {
        let floors = sweep.experiment.floors;
        let policies = sweep.file.policies.clone();
        let mut distributions = Vec::new();
        let mut worst = Vec::new();
        let mut below_floor = Vec::new();
        for policy in &policies {
            for floor in floors {
                // (value, case) with failures as infinity; cases without the ratio are skipped.
                let mut values: Vec<(f64, usize)> = cases
                    .iter()
                    .filter_map(|case| {
                        let run = case.results.iter().find(|run| &run.policy == policy)?;
                        match (&run.failed, run.ratios.get(floor.name)) {
                            (Some(_), _) => Some((f64::INFINITY, case.index)),
                            (None, Some(ratio)) => Some((*ratio, case.index)),
                            (None, None) => None,
                        }
                    })
                    .collect();
                values.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                let sorted: Vec<f64> = values.iter().map(|(value, _)| *value).collect();
                let at = |quantile: f64| percentile(&sorted, quantile).filter(|v| v.is_finite());
                distributions.push(Distribution {
                    policy: policy.clone(),
                    ratio: floor.name.to_string(),
                    cases: sorted.len(),
                    failed: sorted.iter().filter(|value| value.is_infinite()).count(),
                    min: at(0.0),
                    p10: at(0.1),
                    median: at(0.5),
                    p90: at(0.9),
                    max: at(1.0),
                });
                worst.extend(
                    values
                        .iter()
                        .rev()
                        .take(WORST_PER_RATIO)
                        .map(|(value, case)| Worst {
                            policy: policy.clone(),
                            ratio: floor.name.to_string(),
                            case: *case,
                            value: value.is_finite().then_some(*value),
                        }),
                );
            }
        }
        for case in &cases {
            for run in case.results.iter().filter(|run| run.failed.is_none()) {
                for floor in floors.iter().filter(|floor| floor.beaten(&run.metrics)) {
                    below_floor.push(BelowFloor {
                        case: case.index,
                        policy: run.policy.clone(),
                        ratio: floor.name.to_string(),
                        metric: run.metrics[floor.metric],
                        floor: run.metrics[floor.floor],
                    });
                }
            }
        }
        Self {
            sweep: sweep.file.name.clone(),
            kind: sweep.file.kind.clone(),
            workload: sweep.file.workload.clone(),
            seed,
            policies,
            ratios: floors
                .iter()
                .map(|floor| RatioName {
                    name: floor.name.into(),
                    metric: floor.metric.into(),
                    floor: floor.floor.into(),
                })
                .collect(),
            cases,
            distributions,
            worst,
            below_floor,
        }
    }

    /// The report as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|error| format!("{{\"error\":\"{error}\"}}"))
    }

    /// The report as Markdown tables: [`Self::summary_table`] then [`Self::cases_table`].
    pub fn to_table(&self, file: &str) -> String {
        format!("{}\n{}", self.summary_table(file), self.cases_table())
    }

    /// Distributions, worst cases with their drawn values (`file` names the sweep in the rerun
    /// command) and any result below its floor.
    pub fn summary_table(&self, file: &str) -> String {
        let show = |value: Option<f64>| value.map_or("failed".to_string(), format_number);
        let mut out = format!(
            "sweep `{}` (kind {}, workload {}, seed {}, {} cases)\n\n",
            self.sweep,
            self.kind,
            self.workload,
            self.seed,
            self.cases.len()
        );
        out.push_str(
            "| policy | ratio | cases | failed | min | p10 | median | p90 | max |\n\
             |---|---|---|---|---|---|---|---|---|\n",
        );
        for d in &self.distributions {
            if d.cases == 0 {
                out.push_str(&format!(
                    "| {} | {} | 0 | 0 | no case reported {} | | | | |\n",
                    d.policy, d.ratio, d.ratio
                ));
                continue;
            }
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                d.policy,
                d.ratio,
                d.cases,
                d.failed,
                show(d.min),
                show(d.p10),
                show(d.median),
                show(d.p90),
                show(d.max)
            ));
        }
        out.push_str(&format!(
            "\nWorst cases (rerun one alone: `meshwire lab sweep {file} --seed {} --print-case K \
             > case.toml && meshwire lab run case.toml`):\n\n\
             | policy | ratio | case | value | link | params |\n|---|---|---|---|---|---|\n",
            self.seed
        ));
        for worst in &self.worst {
            let case = &self.cases[worst.case];
            out.push_str(&format!(
                "| {} | {} | {} | {} | `{}` | `{}` |\n",
                worst.policy,
                worst.ratio,
                worst.case,
                show(worst.value),
                compact(&case.link),
                compact(&case.params)
            ));
        }
        if !self.below_floor.is_empty() {
            out.push_str("\nBelow their floor (a floor or measurement bug):\n\n");
            for below in &self.below_floor {
                out.push_str(&format!(
                    "- case {} {} {}: {} < floor {}\n",
                    below.case,
                    below.policy,
                    below.ratio,
                    format_number(below.metric),
                    format_number(below.floor)
                ));
            }
        }
        out
    }

    /// Every case's metric, floor and ratio per policy, or its failure.
    pub fn cases_table(&self) -> String {
        let mut out = String::from("| case | policy | ratio | metric | floor | ratio value |\n");
        out.push_str("|---|---|---|---|---|---|\n");
        for case in &self.cases {
            for run in &case.results {
                if let Some(reason) = &run.failed {
                    out.push_str(&format!(
                        "| {} | {} | | | | failed: {} |\n",
                        case.index,
                        run.policy,
                        reason.replace('|', "/")
                    ));
                    continue;
                }
                for ratio in &self.ratios {
                    let (Some(metric), Some(floor), Some(value)) = (
                        run.metrics.get(&ratio.metric),
                        run.metrics.get(&ratio.floor),
                        run.ratios.get(&ratio.name),
                    ) else {
                        continue;
                    };
                    out.push_str(&format!(
                        "| {} | {} | {} | {} = {} | {} = {} | {} |\n",
                        case.index,
                        run.policy,
                        ratio.name,
                        ratio.metric,
                        format_number(*metric),
                        ratio.floor,
                        format_number(*floor),
                        format_number(*value)
                    ));
                }
            }
        }
        out
    }
}

/// A drawn value on one line, without quotes around keys.
fn compact(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Object(map) => {
            let fields: Vec<String> = map
                .iter()
                .filter(|(_, value)| !value.is_null())
                .map(|(key, value)| format!("{key}={}", compact(value)))
                .collect();
            format!("{{{}}}", fields.join(", "))
        }
        serde_json::Value::Array(items) => {
            let items: Vec<String> = items.iter().map(compact).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUORUM: &str = r#"
name = "q"
description = "d"
kind = "zold-fetch"
workload = "quorum-reads"
seed = 3
cases = 2
policies = ["parallel-all", "hedged"]
duration_s = 30
link = { latency_ms = 10, loss = { choose = [0.0, { range = [0.0, 0.01] }] } }

[params]
servers = { range = [4, 6] }
slow = 1
dead = 0
quorum = { range = [1, 2] }
slow_ms = 300
min_latency_ms = { range = [5, 10] }
max_latency_ms = { range = [10, 40], scale = "log" }
reads = 12
reads_per_s = 20
warmup_ms = 500
deadline_ms = 2000
"#;

    fn error(text: &str) -> String {
        Sweep::parse(text, "inline").unwrap_err().to_string()
    }

    fn case_params(sweep: &Sweep, seed: u64, index: usize) -> toml::Table {
        let scenario = ScenarioFile::parse(&sweep.case_text(seed, index), "case").unwrap();
        let case = &scenario.cases[0];
        case.params.clone().into_iter().collect()
    }

    #[test]
    fn cases_are_drawn_per_seed_and_index_within_their_specs() {
        let sweep = Sweep::parse(QUORUM, "inline").unwrap();
        assert_eq!(sweep.case_text(3, 5), sweep.case_text(3, 5));
        assert_ne!(sweep.case_text(3, 5), sweep.case_text(4, 5));
        let drawn: Vec<toml::Table> = (0..40).map(|index| case_params(&sweep, 3, index)).collect();
        let servers: Vec<i64> = drawn
            .iter()
            .map(|params| params["servers"].as_integer().unwrap())
            .collect();
        assert!(servers.iter().all(|servers| (4..=6).contains(servers)));
        for value in 4..=6 {
            assert!(servers.contains(&value), "{value} never drawn: {servers:?}");
        }
        for params in &drawn {
            let max = params["max_latency_ms"].as_integer().unwrap();
            assert!((10..=40).contains(&max), "{max}");
            assert_eq!(params["slow"].as_integer(), Some(1));
        }
        // The printed case is a scenario of the sweep's kind, with the case's own seed.
        let scenario = ScenarioFile::parse(&sweep.case_text(3, 1), "case").unwrap();
        assert_eq!(scenario.kind, "zold-fetch");
        assert_eq!(scenario.seed, sweep.case_seed(3, 1));
        assert_eq!(scenario.policies, ["parallel-all", "hedged"]);
        let losses: Vec<f64> = (0..40)
            .map(|index| {
                let text = sweep.case_text(3, index);
                ScenarioFile::parse(&text, "case").unwrap().cases[0]
                    .link
                    .loss
            })
            .collect();
        assert!(losses.iter().all(|loss| (0.0..=0.01).contains(loss)));
        assert!(losses.contains(&0.0) && losses.iter().any(|loss| *loss > 0.0));
    }

    #[test]
    fn repeat_draws_lists_of_drawn_elements() {
        let text = r#"
name = "m"
description = "d"
kind = "multipath"
workload = "transfer"
seed = 1
cases = 1
policies = ["meshwire"]
duration_s = 10
link = { latency_ms = 5 }
params = { mib = 1, paths = { repeat = [2, 4], each = { latency_ms = { range = [5, 50] }, rate_packets_per_s = { range = [100, 200] } } } }
"#;
        let sweep = Sweep::parse(text, "inline").unwrap();
        let mut lengths = Vec::new();
        for index in 0..30 {
            let params = case_params(&sweep, 1, index);
            let paths = params["paths"].as_array().unwrap();
            lengths.push(paths.len());
            for path in paths {
                let rate = path["rate_packets_per_s"].as_integer().unwrap();
                assert!((100..=200).contains(&rate), "{rate}");
            }
        }
        assert!(lengths.iter().all(|length| (2..=4).contains(length)));
        assert!(lengths.contains(&2) && lengths.contains(&4), "{lengths:?}");
    }

    #[test]
    fn bad_files_are_refused_naming_the_field() {
        let unknown = QUORUM.replace("cases = 2", "cases = 2\nrepeats = 3");
        assert!(error(&unknown).contains("repeats"), "{}", error(&unknown));
        let empty = QUORUM.replace("range = [4, 6]", "range = [6, 4]");
        let message = error(&empty);
        assert!(
            message.contains("params.servers") && message.contains("empty"),
            "{message}"
        );
        let zero_rate = QUORUM.replace(
            "link = { latency_ms = 10,",
            "link = { rate_mbit_per_s = { range = [0.0, 10.0] }, latency_ms = 10,",
        );
        let message = error(&zero_rate);
        assert!(
            message.contains("link.rate_mbit_per_s") && message.contains("not positive"),
            "{message}"
        );
        let full_loss = QUORUM.replace("range = [0.0, 0.01]", "range = [0.0, 1.0]");
        let message = error(&full_loss);
        assert!(
            message.contains("link.loss[1]") && message.contains("loss 1 is not in [0, 1)"),
            "{message}"
        );
        let misspelt = QUORUM.replace("slow_ms = 300", "slow_mss = 300");
        let message = error(&misspelt);
        assert!(message.contains("slow_mss"), "{message}");
        let bad_spec = QUORUM.replace("range = [1, 2]", "range = [1, 2], step = 1");
        let message = error(&bad_spec);
        assert!(
            message.contains("params.quorum") && message.contains("step"),
            "{message}"
        );
        let no_choice = QUORUM.replace("choose = [0.0, { range = [0.0, 0.01] }]", "choose = []");
        assert!(error(&no_choice).contains("choose is empty"));
        let wrong_kind = QUORUM.replace("kind = \"zold-fetch\"", "kind = \"scale\"");
        assert!(error(&wrong_kind).contains("no physical floor"));
        let no_cases = QUORUM.replace("cases = 2", "cases = 0");
        assert!(error(&no_cases).contains("cases"));
    }

    #[test]
    fn a_sweep_is_deterministic_keeps_failures_and_reports_ratios() {
        // Case draws where quorum exceeds the live servers fail at run time: make one certain.
        let text = QUORUM.replace("dead = 0", "dead = { choose = [0, 5] }");
        let sweep = Sweep::parse(&text, "inline").unwrap();
        let first = sweep.run(3, 3, |_| {});
        let second = sweep.run(3, 3, |_| {});
        assert_eq!(first.to_json(), second.to_json());
        assert_eq!(first.cases.len(), 3);
        assert!(first.below_floor.is_empty(), "{:?}", first.below_floor);
        for case in &first.cases {
            assert_eq!(case.results.len(), 2);
            for run in &case.results {
                match &run.failed {
                    Some(reason) => assert!(run.ratios.is_empty(), "{reason}"),
                    None => {
                        let ratio = run.ratios["p99"];
                        assert!(ratio >= 1.0 - 1.0 / run.metrics["ideal_ms_p99"], "{ratio}");
                    }
                }
            }
        }
        let failed = first
            .cases
            .iter()
            .flat_map(|case| &case.results)
            .filter(|run| run.failed.is_some())
            .count();
        assert!(
            failed > 0,
            "seed 3 draws a case with 5 dead of at most 6 servers"
        );
        for distribution in &first.distributions {
            assert_eq!(distribution.cases, 3, "{distribution:?}");
        }
        let counted: usize = first.distributions.iter().map(|d| d.failed).sum();
        assert_eq!(counted, failed);
        assert_eq!(first.worst.len(), 2 * 3);
    }
}
