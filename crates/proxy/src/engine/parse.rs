//! Reading an engine's load out of its Prometheus text page.
//!
//! Only the sample lines of the few names we read are parsed, and those strictly: name, an
//! optional label set with quoted values, a finite value of at least zero, an optional integer
//! timestamp. Every other line is passed over after its name is read, so a histogram family we
//! never look at cannot make a page unreadable; comments (`# HELP`, `# TYPE`) are skipped.

use spillway_config::Engine;

/// An engine's load at one scrape, summed over its label sets (vLLM labels every series by
/// `model_name`, and by `engine` under data parallelism).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Requests the engine is running (in its current batch).
    pub running: f64,
    /// Requests queued in the engine, not yet scheduled.
    pub waiting: f64,
    /// Share of the KV cache in use, 0 to 1; the fullest label set when there are several.
    /// `None` when the engine does not export it.
    pub kv_usage: Option<f64>,
}

/// Why a page gave no reading.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    #[error("no sample of {engine}'s load metrics on the page")]
    NoEngineMetrics { engine: &'static str },
    #[error("{metric} is missing from the page")]
    Missing { metric: &'static str },
    #[error("line {line}: {metric} is not a sample line")]
    Malformed { line: usize, metric: &'static str },
    #[error("line {line}: {metric} is {value:?}, not a finite number of at least 0")]
    BadValue {
        line: usize,
        metric: &'static str,
        value: String,
    },
    #[error("line {line}: {metric} is {value}, above 1 for a share")]
    NotAShare {
        line: usize,
        metric: &'static str,
        value: f64,
    },
}

/// The names one engine exports its load under.
struct Family {
    engine: Engine,
    running: &'static str,
    waiting: &'static str,
    /// In order of preference: vLLM renamed `gpu_cache_usage_perc` (still exported, deprecated,
    /// by releases that have both), and both are shares from 0 to 1 despite the name.
    kv: &'static [&'static str],
}

/// In the order `Auto` tries them.
const FAMILIES: [Family; 4] = [
    Family {
        engine: Engine::Vllm,
        running: "vllm:num_requests_running",
        waiting: "vllm:num_requests_waiting",
        kv: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
    },
    Family {
        engine: Engine::Sglang,
        running: "sglang:num_running_reqs",
        waiting: "sglang:num_queue_reqs",
        kv: &["sglang:token_usage"],
    },
    Family {
        engine: Engine::Llamacpp,
        running: "llamacpp:requests_processing",
        waiting: "llamacpp:requests_deferred",
        kv: &["llamacpp:kv_cache_usage_ratio"],
    },
    Family {
        engine: Engine::Tgi,
        running: "tgi_batch_current_size",
        waiting: "tgi_queue_size",
        kv: &[],
    },
];

/// The most names one family reads: running, waiting and two KV names.
const SLOTS: usize = 4;

/// Reads `engine`'s load from `text`; for [`Engine::Auto`], the first family (vLLM, SGLang,
/// llama.cpp, TGI) with a sample on the page is the engine. Returns the engine read.
///
/// `engine` must not be [`Engine::None`] (nothing is scraped then); it reads as no metrics.
pub fn parse(engine: Engine, text: &str) -> Result<(Engine, Sample), ParseError> {
    let families: Vec<&Family> = FAMILIES
        .iter()
        .filter(|f| engine == Engine::Auto || f.engine == engine)
        .collect();
    let mut seen = vec![[Total::default(); SLOTS]; families.len()];
    for (index, line) in text.lines().enumerate() {
        let line = line.trim_start_matches([' ', '\t']);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name = &line[..line.find(['{', ' ', '\t']).unwrap_or(line.len())];
        for (f, family) in families.iter().enumerate() {
            if let Some(slot) = family.slot(name) {
                let metric = family.name(slot);
                let value = sample_value(&line[name.len()..], index + 1, metric)?;
                seen[f][slot].add(value, slot >= 2);
            }
        }
    }
    let Some((family, totals)) = families
        .iter()
        .zip(&seen)
        .find(|(_, totals)| totals.iter().any(|t| t.count > 0))
    else {
        let engine = match engine {
            Engine::Auto => "any known engine",
            other => other.as_str(),
        };
        return Err(ParseError::NoEngineMetrics { engine });
    };
    for slot in [0, 1] {
        if totals[slot].count == 0 {
            return Err(ParseError::Missing {
                metric: family.name(slot),
            });
        }
    }
    let kv = (2..SLOTS).find(|&slot| totals[slot].count > 0);
    if let Some(slot) = kv.filter(|&slot| totals[slot].value > 1.0) {
        return Err(ParseError::NotAShare {
            line: totals[slot].line,
            metric: family.name(slot),
            value: totals[slot].value,
        });
    }
    let kv_usage = kv.map(|slot| totals[slot].value);
    let sample = Sample {
        running: totals[0].value,
        waiting: totals[1].value,
        kv_usage,
    };
    Ok((family.engine, sample))
}

impl Family {
    fn slot(&self, name: &str) -> Option<usize> {
        if name == self.running {
            Some(0)
        } else if name == self.waiting {
            Some(1)
        } else {
            self.kv.iter().position(|k| *k == name).map(|i| i + 2)
        }
    }

    fn name(&self, slot: usize) -> &'static str {
        match slot {
            0 => self.running,
            1 => self.waiting,
            _ => self.kv[slot - 2],
        }
    }
}

/// One metric over its label sets: counts are summed, shares take the fullest.
#[derive(Debug, Clone, Copy, Default)]
struct Total {
    value: f64,
    count: usize,
    /// The line of the value kept for a share, for the error that names it.
    line: usize,
}

impl Total {
    fn add(&mut self, value: (f64, usize), share: bool) {
        let (v, line) = value;
        if !share {
            self.value += v;
        } else if self.count == 0 || v > self.value {
            self.value = v;
            self.line = line;
        }
        self.count += 1;
    }
}

/// The value of a sample line whose name has been read; `rest` is what follows the name.
fn sample_value(rest: &str, line: usize, metric: &'static str) -> Result<(f64, usize), ParseError> {
    let malformed = || ParseError::Malformed { line, metric };
    let rest = match rest.strip_prefix('{') {
        Some(labels) => skip_labels(labels).ok_or_else(malformed)?,
        None => rest,
    };
    let rest = rest.strip_prefix([' ', '\t']).ok_or_else(malformed)?;
    let mut fields = rest.split([' ', '\t']).filter(|f| !f.is_empty());
    let text = fields.next().ok_or_else(malformed)?;
    if let Some(timestamp) = fields.next() {
        timestamp.parse::<i64>().map_err(|_| malformed())?;
    }
    if fields.next().is_some() {
        return Err(malformed());
    }
    let bad = || ParseError::BadValue {
        line,
        metric,
        value: text.chars().take(32).collect(),
    };
    let value = go_float(text).ok_or_else(bad)?;
    if !value.is_finite() || value < 0.0 {
        return Err(bad());
    }
    // -0 reads as 0: a count is never negative.
    Ok((value.abs(), line))
}

/// A float as Go's `ParseFloat` writes it for Prometheus: decimal or exponent notation,
/// `NaN`, `+Inf`, `-Inf`. Rust's parser accepts more spellings (`infinity`, `inf`); those are
/// refused later as not finite anyway.
fn go_float(text: &str) -> Option<f64> {
    let digits = text.trim_start_matches(['+', '-']);
    let numeric = digits
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'));
    if numeric || matches!(text, "NaN" | "+Inf" | "-Inf" | "Inf") {
        text.parse().ok()
    } else {
        None
    }
}

/// Skips a label set after its `{`: `name="value"` pairs separated by commas (a trailing comma
/// allowed), values with only the escapes `\\`, `\"` and `\n`. Returns what follows the `}`.
fn skip_labels(mut s: &str) -> Option<&str> {
    loop {
        s = s.trim_start_matches([' ', '\t']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some(rest);
        }
        let name_len = s
            .bytes()
            .position(|b| !(b.is_ascii_alphanumeric() || b == b'_'))
            .unwrap_or(s.len());
        if name_len == 0 || s.as_bytes()[0].is_ascii_digit() {
            return None;
        }
        s = s[name_len..].trim_start_matches([' ', '\t']);
        s = s.strip_prefix('=')?.trim_start_matches([' ', '\t']);
        s = s.strip_prefix('"')?;
        s = skip_quoted(s)?;
        s = s.trim_start_matches([' ', '\t']);
        match s.strip_prefix(',') {
            Some(rest) => s = rest,
            None => return s.strip_prefix('}'),
        }
    }
}

/// Skips a label value after its opening quote; returns what follows the closing quote.
fn skip_quoted(s: &str) -> Option<&str> {
    let mut bytes = s.bytes().enumerate();
    while let Some((i, b)) = bytes.next() {
        match b {
            b'"' => return Some(&s[i + 1..]),
            b'\\' => match bytes.next() {
                Some((_, b'\\' | b'"' | b'n')) => {}
                _ => return None,
            },
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests;
