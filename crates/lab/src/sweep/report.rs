//! What a sweep reports: every case, each ratio's distribution per policy, the worst cases.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Sweep, WORST_PER_RATIO};
use crate::experiments::Experiment;
use crate::scenario::format_number;
use crate::stats::{percentile, round_metric, Metrics};

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
    pub(super) fn new(
        experiment: &Experiment,
        policy: &str,
        outcome: Result<Metrics, String>,
    ) -> Self {
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
    pub(super) fn new(sweep: &Sweep, seed: u64, cases: Vec<CaseRun>) -> Self {
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
