//! Sweep specs: checking the values or specs a sweep file gives, and drawing a case from them.

use rand::rngs::SmallRng;
use rand::Rng;

/// Which value a spec takes when a case is built.
pub(super) enum Pick<'a> {
    /// Drawn from the generator.
    Random(&'a mut SmallRng),
    /// Every spec takes its first option (lower bound, first choice, shortest list) except the
    /// one at `field`, which takes option `which`.
    Corner { field: &'a str, which: usize },
}

/// The kinds of spec a table can be.
pub(super) const SPEC_KEYS: [&str; 3] = ["range", "choose", "repeat"];

/// A spec's kind, to name its options in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SpecKind {
    Range,
    Choose,
    Repeat,
}

impl SpecKind {
    pub(super) fn option(self, which: usize) -> String {
        match (self, which) {
            (Self::Range, 0) => "its lower bound".into(),
            (Self::Range, _) => "its upper bound".into(),
            (Self::Choose, which) => format!("choice {which}"),
            (Self::Repeat, 0) => "its shortest list".into(),
            (Self::Repeat, _) => "its longest list".into(),
        }
    }
}

/// Collects every spec's field and option count, or the first invalid spec.
pub(super) fn spec_options(
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

pub(super) fn check_keys(
    field: &str,
    table: &toml::Table,
    allowed: &[&str],
) -> Result<(), (String, String)> {
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
pub(super) enum Bounds {
    Integer(i64, i64),
    Float(f64, f64),
}

pub(super) fn range_bounds(table: &toml::Table) -> Result<(Bounds, bool), String> {
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

pub(super) fn repeat_bounds(table: &toml::Table) -> Result<(usize, usize), String> {
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

pub(super) fn number(value: &toml::Value) -> Option<f64> {
    match value {
        toml::Value::Integer(number) => Some(*number as f64),
        toml::Value::Float(number) => Some(*number),
        _ => None,
    }
}

/// Rounds a drawn float to 4 significant digits, so printed cases stay readable.
pub(super) fn round_drawn(value: f64) -> f64 {
    if value == 0.0 || !value.is_finite() {
        return value;
    }
    let digits = 4 - value.abs().log10().ceil() as i32;
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

/// The value `spec` takes under `pick`. Specs were checked at load, so an invalid one cannot
/// reach here; if one did, it is passed through as written and the scenario check refuses it.
pub(super) fn draw(field: &str, spec: &toml::Value, pick: &mut Pick<'_>) -> toml::Value {
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
