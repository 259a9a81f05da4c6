//! `meshwire lab`: list and run scenario files.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use meshwire_lab::scenario::format_number;
use meshwire_lab::{
    experiments, run_host, run_scenario, Mode, Placement, Rate, Report, ScenarioFile, EXPERIMENTS,
};

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
    /// Run every scenario in a directory and write the scoreboard (docs/RESULTS.md).
    Results {
        /// Where the scenario files are.
        #[arg(long, default_value = "scenarios")]
        dir: PathBuf,
        /// Where to write the Markdown.
        #[arg(long, default_value = "docs/RESULTS.md")]
        out: PathBuf,
    },
    /// List the scenarios in a directory, one line each, then the experiment kinds they can use.
    List {
        /// Where the scenario files are.
        #[arg(long, default_value = "scenarios")]
        dir: PathBuf,
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
            let show_progress = std::io::stderr().is_terminal();
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
            let report = run_scenario(&scenario, seed, mode, |case, elapsed| {
                if show_progress {
                    eprint!("\r\x1b[2K{case}: {:.1} s", elapsed.as_secs_f64());
                    let _ = std::io::stderr().flush();
                }
            })?;
            if show_progress {
                eprint!("\r\x1b[2K");
            }
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_table());
            }
            Ok(())
        }
        LabCommand::Results { dir, out } => {
            let mut markdown = String::from(RESULTS_HEADER);
            for path in scenario_files(&dir)? {
                let scenario = ScenarioFile::load(&path)?;
                eprintln!("running {}", path.display());
                let report = run_scenario(&scenario, scenario.seed, Mode::Virtual, |_, _| {})
                    .with_context(|| format!("scenario {} failed", path.display()))?;
                markdown.push_str(&format!(
                    "## {}\n\n{}\n\nFile: `{}`. Command: `meshwire lab run {}`.\n\n{}\n",
                    scenario.name,
                    scenario.description,
                    path.display(),
                    path.display(),
                    report.to_table()
                ));
                // The real-socket cross-check, for scenarios whose every policy runs in real time.
                let all_real = experiments::find(&scenario.kind).is_some_and(|experiment| {
                    scenario
                        .policies
                        .iter()
                        .all(|policy| experiment.runs_in_real_time(policy))
                });
                if all_real {
                    eprintln!("running {} on real sockets", path.display());
                    let real = run_scenario(&scenario, scenario.seed, Mode::Realtime, |_, _| {})
                        .with_context(|| format!("real-time run of {} failed", path.display()))?;
                    markdown.push_str(&format!(
                        "### {} on real UDP sockets (cross-check)\n\nThe same scenario over \
                         loopback in real time, the emulated socket adding delay, rate and loss \
                         in user space. Command: `meshwire lab run --realtime {}`. These numbers \
                         vary from run to run.\n\n{}\n",
                        scenario.name,
                        path.display(),
                        real.to_table()
                    ));
                }
            }
            std::fs::write(&out, markdown)
                .with_context(|| format!("cannot write {}", out.display()))?;
            eprintln!("wrote {}", out.display());
            Ok(())
        }
        LabCommand::Compare {
            base,
            other,
            names,
            tolerance,
            ignore,
        } => compare(&base, &other, &names, tolerance, &ignore),
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

/// Prints two reports side by side and fails if a judged metric is out of tolerance.
fn compare(
    base: &Path,
    other: &Path,
    names: &str,
    tolerance: f64,
    ignore: &[String],
) -> anyhow::Result<()> {
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
            "only in one"
        } else if ignore.iter().any(|entry| {
            *entry == row.metric
                || *entry == format!("{}/{}", row.case, row.metric)
                || *entry == format!("{}/{}/{}", row.case, row.policy, row.metric)
        }) {
            "not judged"
        } else {
            judged += 1;
            if row.within(tolerance) {
                "ok"
            } else {
                outside.push(format!("{}/{}/{}", row.case, row.policy, row.metric));
                "OUTSIDE"
            }
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
    println!(
        "\n{} of {judged} compared metrics within {:.0}%",
        judged - outside.len(),
        tolerance * 100.0
    );
    if outside.is_empty() {
        Ok(())
    } else {
        anyhow::bail!(
            "{} outside {:.0}%: {}",
            outside.len(),
            tolerance * 100.0,
            outside.join(", ")
        )
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
