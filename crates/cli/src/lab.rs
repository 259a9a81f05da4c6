//! `meshwire lab`: list and run scenario files, plot their reports.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use meshwire_lab::plot::PlotInput;
use meshwire_lab::scenario::{format_number, MetricComparison};
use meshwire_lab::{
    experiments, run_host, run_scenario_observed, Mode, Placement, Rate, Report, RunEvent,
    ScenarioFile, Sweep, EXPERIMENTS,
};

use crate::progress::Progress;

#[derive(Debug, clap::Subcommand)]
pub enum LabCommand {
    /// Run one scenario and print its table (or one JSON object with --json).
    Run {
        /// The scenario file.
        file: PathBuf,
        /// Override the scenario's seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Print exactly one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// Cross-check on real UDP sockets on loopback in real time (127.0.0.2 and up) instead of
        /// virtual time. Not deterministic; crash and restart events are not supported; policies
        /// that need virtual time are left out (with a note on standard error).
        #[arg(long)]
        realtime: bool,
    },
    /// Run an experiment over randomly drawn cases and report each result's ratio to its
    /// physical floor: per case, per policy's distribution, and the worst cases.
    Sweep {
        /// The sweep file (see scenarios/sweeps/).
        file: PathBuf,
        /// How many cases to draw (default: the file's `cases`).
        #[arg(long)]
        cases: Option<usize>,
        /// Override the sweep's seed (same seed, same cases, same report).
        #[arg(long)]
        seed: Option<u64>,
        /// Print exactly one JSON object instead of tables.
        #[arg(long)]
        json: bool,
        /// Print case K as an ordinary scenario file (to rerun and debug it alone) and exit.
        #[arg(long, value_name = "K")]
        print_case: Option<usize>,
    },
    /// Compare two reports (`lab run --json` output) metric by metric: both values and their
    /// ratio. Exits with an error when a compared metric differs by more than the tolerance.
    Compare {
        /// The reference report.
        base: PathBuf,
        /// The report judged against it.
        other: PathBuf,
        /// Column names for the two reports.
        #[arg(long, default_value = "base,other")]
        names: String,
        /// Largest accepted |other / base - 1|.
        #[arg(long, default_value_t = 0.1)]
        tolerance: f64,
        /// Metrics shown but not judged (repeatable): METRIC, CASE/METRIC or CASE/POLICY/METRIC.
        #[arg(long)]
        ignore: Vec<String>,
        /// A metric judged with its own tolerance (repeatable): ENTRY=FRACTION, ENTRY named as
        /// for --ignore. The first entry that names a metric wins.
        #[arg(long, value_name = "ENTRY=FRACTION", value_parser = parse_tolerance_for)]
        tolerance_for: Vec<(String, f64)>,
    },
    /// For scripts: one tab-separated line per case and policy of a scenario file: case,
    /// policy, the case's hosts ("-" when the policy needs virtual time), the case link's bit
    /// rate in bit/s (0: unlimited or a packet rate), its queue in bytes, its duration in s.
    #[command(hide = true)]
    Plan {
        /// The scenario file.
        file: PathBuf,
    },
    /// For scripts: run one host of one case in this process, on real sockets at its address,
    /// the other hosts in their own processes (scripts/netns-lab.sh). Prints the case's result
    /// as one JSON line if this host measured it.
    #[command(hide = true)]
    Host {
        /// The scenario file.
        file: PathBuf,
        /// The case.
        #[arg(long)]
        case: String,
        /// The policy.
        #[arg(long)]
        policy: String,
        /// The host this process runs.
        #[arg(long)]
        host: String,
        /// Every host's address: name=ip,name=ip,...
        #[arg(long)]
        hosts: String,
        /// A directory every host's process can reach, for their control sockets.
        #[arg(long)]
        control: PathBuf,
        /// When the run starts, in milliseconds since the Unix epoch (the same for every host).
        #[arg(long)]
        start_unix_ms: u64,
        /// Override the scenario's seed.
        #[arg(long)]
        seed: Option<u64>,
        /// The kernel serializes bit-rate links (tc tbf); the sockets only delay, jitter and lose.
        #[arg(long)]
        kernel_rate: bool,
    },
    /// Run every scenario and every sweep and write the scoreboard (docs/RESULTS.md) with its
    /// charts.
    Results {
        /// Where the scenario files are.
        #[arg(long, default_value = "scenarios")]
        dir: PathBuf,
        /// Where the sweep files are.
        #[arg(long, default_value = "scenarios/sweeps")]
        sweeps: PathBuf,
        /// Cases per sweep (default: each file's `cases`).
        #[arg(long)]
        sweep_cases: Option<usize>,
        /// Where to write the Markdown.
        #[arg(long, default_value = "docs/RESULTS.md")]
        out: PathBuf,
        /// Where to write the charts (SVG) the Markdown shows.
        #[arg(long, default_value = "docs/plots")]
        plots: PathBuf,
    },
    /// List the scenarios in a directory, one line each, then the experiment kinds they can use.
    List {
        /// Where the scenario files are.
        #[arg(long, default_value = "scenarios")]
        dir: PathBuf,
    },
    /// Draw reports as SVG charts and print the paths written. A scenario report (`lab run
    /// --json`) gives a grouped bar chart per --metric (x = case, a bar per policy), named
    /// <scenario>-<metric>.svg; a sweep report (`lab sweep --json`) gives the CDF of each of its
    /// ratios over the cases, a curve per policy, named <sweep>-<ratio>.svg.
    Plot {
        /// The JSON reports.
        #[arg(required = true, value_name = "FILE.json")]
        files: Vec<PathBuf>,
        /// Where to write the SVG files (created if missing).
        #[arg(long, default_value = "docs/plots")]
        out: PathBuf,
        /// A metric to chart from scenario reports; repeat for more (required for them, ignored
        /// for sweep reports, which chart every ratio).
        #[arg(long = "metric", value_name = "NAME")]
        metrics: Vec<String>,
    },
}

pub fn run(command: LabCommand) -> anyhow::Result<()> {
    match command {
        LabCommand::Run {
            file,
            seed,
            json,
            realtime,
        } => {
            let scenario = ScenarioFile::load(&file)?;
            let seed = seed.unwrap_or(scenario.seed);
            let mode = if realtime {
                Mode::Realtime
            } else {
                Mode::Virtual
            };
            if let Some(experiment) = experiments::find(&scenario.kind).filter(|_| realtime) {
                let virtual_only: Vec<&str> = scenario
                    .policies
                    .iter()
                    .filter(|policy| !experiment.runs_in_real_time(policy))
                    .map(String::as_str)
                    .collect();
                if !virtual_only.is_empty() {
                    eprintln!(
                        "note: {} need virtual time and are left out",
                        virtual_only.join(", ")
                    );
                }
            }
            let progress = Progress::new(trials(&scenario));
            let report =
                run_scenario_observed(&scenario, seed, mode, |event| observe(&progress, 0, event))?;
            progress.finish();
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_table());
            }
            Ok(())
        }
        LabCommand::Sweep {
            file,
            cases,
            seed,
            json,
            print_case,
        } => {
            let sweep = Sweep::load(&file)?;
            let seed = seed.unwrap_or(sweep.file().seed);
            if let Some(index) = print_case {
                print!("{}", sweep.case_text(seed, index));
                return Ok(());
            }
            let cases = cases.unwrap_or(sweep.file().cases);
            if cases == 0 {
                anyhow::bail!("--cases must be at least 1");
            }
            let progress = Progress::new((cases * sweep.file().policies.len()) as u64);
            let mut current = String::new();
            let report = sweep.run(seed, cases, |step| {
                if step.trial != current {
                    current = step.trial.to_string();
                    progress.start(step.done as u64, step.trial);
                }
                progress.lab_time(step.elapsed);
            });
            progress.finish();
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_table(&file.display().to_string()));
            }
            Ok(())
        }
        LabCommand::Results {
            dir,
            sweeps,
            sweep_cases,
            out,
            plots,
        } => results(&dir, &sweeps, sweep_cases, &out, &plots),
        LabCommand::Compare {
            base,
            other,
            names,
            tolerance,
            ignore,
            tolerance_for,
        } => compare(
            &base,
            &other,
            &names,
            &Judging {
                tolerance,
                ignore,
                tolerance_for,
            },
        ),
        LabCommand::Plan { file } => {
            let scenario = ScenarioFile::load(&file)?;
            let experiment = experiments::find(&scenario.kind)
                .with_context(|| format!("unknown kind {}", scenario.kind))?;
            for case in &scenario.cases {
                let spec = case.link.spec().map_err(anyhow::Error::msg)?;
                let rate = match spec.rate {
                    Rate::BitsPerSec(bits) => bits,
                    Rate::Unlimited | Rate::PacketsPerSec(_) => 0,
                };
                for policy in &scenario.policies {
                    let hosts = match experiment.realtime {
                        Some(real) if experiment.runs_in_real_time(policy) => {
                            (real.hosts)(case).join(",")
                        }
                        _ => "-".to_string(),
                    };
                    println!(
                        "{}\t{}\t{}\t{}\t{}\t{}",
                        case.name, policy, hosts, rate, spec.queue_bytes, case.duration_s
                    );
                }
            }
            Ok(())
        }
        LabCommand::Host {
            file,
            case,
            policy,
            host,
            hosts,
            control,
            start_unix_ms,
            seed,
            kernel_rate,
        } => {
            let scenario = ScenarioFile::load(&file)?;
            let placement = Placement {
                host,
                addresses: parse_hosts(&hosts)?,
                control_dir: control,
                start: SystemTime::UNIX_EPOCH + Duration::from_millis(start_unix_ms),
                kernel_rate,
            };
            let seed = seed.unwrap_or(scenario.seed);
            if let Some(result) = run_host(&scenario, seed, &case, &policy, &placement)? {
                println!("{}", result.to_json());
            }
            Ok(())
        }
        LabCommand::List { dir } => {
            for path in scenario_files(&dir)? {
                let scenario = ScenarioFile::load(&path)?;
                println!(
                    "{:<32} {:<14} {}",
                    path.display(),
                    scenario.kind,
                    scenario.description
                );
            }
            println!("\nkinds (policies), then their workloads:");
            for experiment in EXPERIMENTS {
                println!(
                    "{:<14} {} ({})",
                    experiment.kind,
                    experiment.description,
                    experiment.policies.join(", ")
                );
                for workload in experiment.workloads {
                    println!("  {:<14} {}", workload.name, workload.description);
                }
            }
            Ok(())
        }
        LabCommand::Plot {
            files,
            out,
            metrics,
        } => {
            // Draw everything before writing anything, so a bad file or metric writes nothing.
            let mut charts = Vec::new();
            let mut sources = std::collections::BTreeMap::new();
            for file in &files {
                let origin = file.display().to_string();
                for chart in PlotInput::load(file)?.charts(&metrics, &origin)? {
                    if let Some(first) = sources.insert(chart.file_name.clone(), origin.clone()) {
                        anyhow::bail!(
                            "{first} and {origin} both give the chart {}; plot them into \
                             different --out directories",
                            chart.file_name
                        );
                    }
                    charts.push(chart);
                }
            }
            std::fs::create_dir_all(&out)
                .with_context(|| format!("cannot create {}", out.display()))?;
            for chart in &charts {
                println!("{}", chart.write_to(&out)?.display());
            }
            Ok(())
        }
    }
}

/// `meshwire lab results`: every scenario (and its real-time cross-check), then every sweep, into
/// one Markdown page with charts of each floor ratio.
fn results(
    dir: &Path,
    sweeps_dir: &Path,
    sweep_cases: Option<usize>,
    out: &Path,
    plots: &Path,
) -> anyhow::Result<()> {
    let mut markdown = String::from(RESULTS_HEADER);
    let mut scenarios = Vec::new();
    for path in scenario_files(dir)? {
        let scenario = ScenarioFile::load(&path)?;
        // The real-socket cross-check, for scenarios whose every policy runs in real time.
        let realtime = experiments::find(&scenario.kind).is_some_and(|experiment| {
            scenario
                .policies
                .iter()
                .all(|policy| experiment.runs_in_real_time(policy))
        });
        scenarios.push((path, scenario, realtime));
    }
    let mut sweeps = Vec::new();
    if sweeps_dir.is_dir() {
        for path in scenario_files(sweeps_dir)? {
            let sweep = Sweep::load(&path)?;
            let cases = sweep_cases.unwrap_or(sweep.file().cases);
            sweeps.push((path, sweep, cases));
        }
    }
    let units = scenarios
        .iter()
        .map(|(_, scenario, realtime)| trials(scenario) * if *realtime { 2 } else { 1 })
        .sum::<u64>()
        + sweeps
            .iter()
            .map(|(_, sweep, cases)| (cases * sweep.file().policies.len()) as u64)
            .sum::<u64>();
    std::fs::create_dir_all(plots).with_context(|| format!("cannot create {}", plots.display()))?;
    // Charts are linked relative to the page when they sit below its directory.
    let page_dir = out.parent().unwrap_or(Path::new(""));
    let link = |chart: &Path| -> String {
        chart
            .strip_prefix(page_dir)
            .unwrap_or(chart)
            .display()
            .to_string()
    };
    let draw = |json: String, metrics: &[String], origin: &str| -> anyhow::Result<String> {
        let mut images = String::new();
        for chart in PlotInput::parse(&json, origin)?.charts(metrics, origin)? {
            let path = chart.write_to(plots)?;
            images.push_str(&format!("![{}]({})\n", chart.title, link(&path)));
        }
        Ok(images)
    };
    let progress = Progress::new(units);
    let mut done = 0;
    for (path, scenario, realtime) in &scenarios {
        progress.println(format!("running {}", path.display()));
        let report = run_scenario_observed(scenario, scenario.seed, Mode::Virtual, |event| {
            observe(&progress, done, event)
        })
        .with_context(|| format!("scenario {} failed", path.display()))?;
        done += trials(scenario);
        markdown.push_str(&format!(
            "## {}\n\n{}\n\nFile: `{}`. Command: `meshwire lab run {}`.\n\n{}\n",
            scenario.name,
            scenario.description,
            path.display(),
            path.display(),
            report.to_table()
        ));
        // Each floor's ratio per case and policy, when the kind has floors.
        let ratios: Vec<String> = experiments::find(&scenario.kind)
            .map(|experiment| experiment.floors)
            .unwrap_or_default()
            .iter()
            .map(|floor| format!("{}_over_floor", floor.name))
            .filter(|metric| {
                report
                    .results
                    .iter()
                    .any(|result| result.metrics.contains_key(metric))
            })
            .collect();
        if !ratios.is_empty() {
            markdown.push_str(&draw(
                report.to_json(),
                &ratios,
                &path.display().to_string(),
            )?);
            markdown.push('\n');
        }
        if *realtime {
            progress.println(format!("running {} on real sockets", path.display()));
            // Real sockets can fail for reasons outside the lab (a port in use): the page says so
            // instead of losing every other result.
            let real = run_scenario_observed(scenario, scenario.seed, Mode::Realtime, |event| {
                observe(&progress, done, event)
            })
            .map(|real| real.to_table())
            .unwrap_or_else(|error| format!("Not run: {error:#}\n"));
            done += trials(scenario);
            markdown.push_str(&format!(
                "### {} on real UDP sockets (cross-check)\n\nThe same scenario over \
                 loopback in real time, the emulated socket adding delay, rate and loss \
                 in user space. Command: `meshwire lab run --realtime {}`. These numbers \
                 vary from run to run.\n\n{}\n",
                scenario.name,
                path.display(),
                real
            ));
        }
    }
    if !sweeps.is_empty() {
        markdown.push_str(SWEEPS_HEADER);
    }
    for (path, sweep, cases) in &sweeps {
        progress.println(format!("sweeping {}", path.display()));
        let started = std::time::Instant::now();
        let mut current = String::new();
        let base = done;
        let report = sweep.run(sweep.file().seed, *cases, |step| {
            if step.trial != current {
                current = step.trial.to_string();
                progress.start(base + step.done as u64, step.trial);
            }
            progress.lab_time(step.elapsed);
        });
        done += (cases * sweep.file().policies.len()) as u64;
        let file = path.display().to_string();
        markdown.push_str(&format!(
            "## Sweep `{}`\n\n{}\n\nFile: `{file}`. Command: `meshwire lab sweep {file} \
             --cases {cases}` ({:.0} s on the machine that wrote this page).\n\n{}\n{}\n\
             <details><summary>Every case</summary>\n\n{}\n</details>\n\n",
            sweep.file().name,
            sweep.file().description,
            started.elapsed().as_secs_f64(),
            report.summary_table(&file),
            draw(report.to_json(), &[], &file)?,
            report.cases_table(),
        ));
    }
    progress.finish();
    std::fs::write(out, markdown).with_context(|| format!("cannot write {}", out.display()))?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

/// How many trials (cases × policies) a scenario runs.
fn trials(scenario: &ScenarioFile) -> u64 {
    (scenario.cases.len() * scenario.policies.len()) as u64
}

/// Shows the events of a scenario run whose trials come after `done` units on `progress`.
fn observe(progress: &Progress, done: u64, event: RunEvent<'_>) {
    match event {
        RunEvent::Trial { index, label, .. } => progress.start(done + index as u64, label),
        RunEvent::Elapsed(elapsed) => progress.lab_time(elapsed),
        _ => {}
    }
}

const RESULTS_HEADER: &str = "# Results\n\n\
Every scenario's latest numbers (every file in `scenarios/`, run in the lab) and the criterion\n\
benchmarks. `meshwire lab results` writes the scenario part; the script adds the benchmarks.\n\
Regenerate this page with:\n\n\
```bash\n\
bash scripts/results.sh\n\
```\n\n\
Each table lists the metrics per case and policy, then the scenario's anchors: the published\n\
figures (or, for calibration, the theoretical values) the numbers are judged against. Virtual-time\n\
metrics are deterministic for a seed; `wall_clock_s` is measured on the machine that ran the\n\
command (a 2-core, 24 GiB machine for the committed page).\n\n";

const SWEEPS_HEADER: &str = "# Sweeps\n\n\
Each sweep draws cases of one experiment from its seed (paths, sizes and counts nobody tuned for), \
runs every policy on each with default settings, and reports every result as its ratio to the \
physical floor (`docs/scenarios.md`, Floors): 1 is the floor, failed cases count as infinitely \
bad. Per policy and ratio: the distribution over cases, then the worst cases with their drawn \
link and parameters (rerun one alone with `--print-case K`), a chart of the ratio's distribution \
(one curve per policy; a curve that ends below 1 has failed cases) and every case. The targets \
for meshwire's ratios are set by the issues of this wave; these pages report where it stands.\n\n";

/// `name=ip,name=ip,...` as a map.
fn parse_hosts(text: &str) -> anyhow::Result<BTreeMap<String, IpAddr>> {
    text.split(',')
        .map(|pair| {
            let (name, ip) = pair
                .split_once('=')
                .with_context(|| format!("{pair:?} is not name=ip"))?;
            let ip = ip
                .parse()
                .with_context(|| format!("{ip:?} is not an IP address"))?;
            Ok((name.to_string(), ip))
        })
        .collect()
}

/// How `lab compare` judges a metric: not at all, with its own tolerance, or with the default.
struct Judging {
    tolerance: f64,
    ignore: Vec<String>,
    tolerance_for: Vec<(String, f64)>,
}

impl Judging {
    /// Whether `entry` (METRIC, CASE/METRIC or CASE/POLICY/METRIC) names `row`'s metric.
    fn names(entry: &str, row: &MetricComparison) -> bool {
        *entry == row.metric
            || *entry == format!("{}/{}", row.case, row.metric)
            || *entry == format!("{}/{}/{}", row.case, row.policy, row.metric)
    }

    /// The tolerance `row` is judged with, or `None` when it is shown but not judged.
    fn tolerance(&self, row: &MetricComparison) -> Option<f64> {
        if self.ignore.iter().any(|entry| Self::names(entry, row)) {
            return None;
        }
        Some(
            self.tolerance_for
                .iter()
                .find(|(entry, _)| Self::names(entry, row))
                .map_or(self.tolerance, |&(_, tolerance)| tolerance),
        )
    }
}

/// `--tolerance-for ENTRY=FRACTION`.
fn parse_tolerance_for(text: &str) -> Result<(String, f64), String> {
    let (entry, fraction) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not ENTRY=FRACTION"))?;
    let fraction: f64 = fraction
        .parse()
        .map_err(|_| format!("{fraction:?} is not a number"))?;
    if entry.is_empty() || !(fraction.is_finite() && fraction >= 0.0) {
        return Err(format!(
            "{text:?}: needs a metric and a fraction of at least 0"
        ));
    }
    Ok((entry.to_string(), fraction))
}

/// Prints two reports side by side and fails if a judged metric is out of its tolerance.
fn compare(base: &Path, other: &Path, names: &str, judging: &Judging) -> anyhow::Result<()> {
    let read = |path: &Path| -> anyhow::Result<Report> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Report::from_json(&text).with_context(|| format!("{} is not a report", path.display()))
    };
    let (base, other) = (read(base)?, read(other)?);
    let (base_name, other_name) = names.split_once(',').unwrap_or(("base", "other"));
    println!("| case | policy | metric | {base_name} | {other_name} | ratio | |");
    println!("|---|---|---|---|---|---|---|");
    let show = |value: Option<f64>| value.map_or("-".to_string(), format_number);
    let mut judged = 0;
    let mut outside = Vec::new();
    for row in base.compare(&other) {
        let verdict = if row.base.is_none() || row.other.is_none() {
            "only in one".to_string()
        } else if let Some(tolerance) = judging.tolerance(&row) {
            judged += 1;
            let ok = if row.within(tolerance) {
                "ok"
            } else {
                outside.push(format!("{}/{}/{}", row.case, row.policy, row.metric));
                "OUTSIDE"
            };
            if tolerance == judging.tolerance {
                ok.to_string()
            } else {
                format!("{ok} (within {:.0}%)", tolerance * 100.0)
            }
        } else {
            "not judged".to_string()
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            row.case,
            row.policy,
            row.metric,
            show(row.base),
            show(row.other),
            row.ratio()
                .map_or("-".to_string(), |ratio| format!("{ratio:.3}")),
            verdict
        );
    }
    let within = if judging.tolerance_for.is_empty() {
        format!("within {:.0}%", judging.tolerance * 100.0)
    } else {
        format!(
            "within {:.0}% (or their own tolerance)",
            judging.tolerance * 100.0
        )
    };
    println!(
        "\n{} of {judged} compared metrics {within}",
        judged - outside.len()
    );
    if outside.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{} outside: {}", outside.len(), outside.join(", "))
    }
}

/// The `.toml` files in `dir`, sorted.
pub fn scenario_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(case: &str, policy: &str, metric: &str) -> MetricComparison {
        MetricComparison {
            case: case.to_string(),
            policy: policy.to_string(),
            metric: metric.to_string(),
            base: Some(1.0),
            other: Some(1.2),
        }
    }

    #[test]
    fn a_metric_is_ignored_or_judged_with_the_first_tolerance_that_names_it() {
        let judging = Judging {
            tolerance: 0.1,
            ignore: vec!["a/p/x".to_string()],
            tolerance_for: vec![
                ("a/x".to_string(), 0.25),
                ("x".to_string(), 0.5),
                ("a/p/x".to_string(), 0.9),
            ],
        };
        assert_eq!(judging.tolerance(&row("a", "p", "x")), None);
        assert_eq!(judging.tolerance(&row("a", "q", "x")), Some(0.25));
        assert_eq!(judging.tolerance(&row("b", "p", "x")), Some(0.5));
        assert_eq!(judging.tolerance(&row("b", "p", "y")), Some(0.1));
    }

    #[test]
    fn tolerance_for_refuses_what_is_not_entry_equals_fraction() {
        assert_eq!(
            parse_tolerance_for("a/p/x=0.25"),
            Ok(("a/p/x".to_string(), 0.25))
        );
        for bad in ["x", "x=", "=0.2", "x=-1", "x=nan", "x=y"] {
            assert!(parse_tolerance_for(bad).is_err(), "{bad} accepted");
        }
    }
}
