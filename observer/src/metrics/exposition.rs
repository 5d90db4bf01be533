//! Names the two exposition formats `/metrics` answers in, chosen by the scraper's `Accept` as
//! Prometheus' own clients choose: OpenMetrics 1.0 when asked for, the plain text format 0.0.4
//! otherwise.
//!
//! prometheus-client encodes OpenMetrics only. The plain text format is derived from it: no
//! `# EOF` or `# UNIT` line, and a counter's `# HELP` and `# TYPE` name its samples' `_total`
//! name, as that format requires (OpenMetrics names the family without the suffix).

/// Names an exposition format of `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
    /// `text/plain; version=0.0.4`, the Prometheus text format.
    Text,
}

impl Format {
    /// Picks the format for a request's `Accept` header (absent: the plain text format).
    ///
    /// OpenMetrics only where the scraper names it (version 1.0.0, 0.0.1 or none) with a
    /// quality at least that of any text or wildcard range it also accepts.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let Some(accept) = accept else {
            return Format::Text;
        };
        let (mut openmetrics, mut text) = (0.0f32, 0.0f32);
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default().to_ascii_lowercase();
            let mut quality = 1.0f32;
            let mut version_known = true;
            for parameter in parts {
                let Some((key, value)) = parameter.split_once('=') else {
                    continue;
                };
                let value = value.trim().trim_matches('"');
                match key.trim().to_ascii_lowercase().as_str() {
                    "q" => quality = value.parse().unwrap_or(0.0),
                    "version" => version_known = matches!(value, "1.0.0" | "0.0.1"),
                    _ => {}
                }
            }
            match media.as_str() {
                "application/openmetrics-text" if version_known => {
                    openmetrics = openmetrics.max(quality);
                }
                "text/plain" | "text/*" | "*/*" => text = text.max(quality),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= text {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }

    /// Returns the `Content-Type` of a body in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// Rewrites prometheus-client's OpenMetrics text in the plain text format 0.0.4.
pub fn to_text_format(openmetrics: &str) -> String {
    let mut text = String::with_capacity(openmetrics.len());
    // A family's `# HELP` comes before its `# TYPE`, which says whether the name takes `_total`.
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some(held) = help.replace(rest) {
                push_help(&mut text, held, "");
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.rsplit_once(' ').unwrap_or((rest, "untyped"));
            let (suffix, kind) = match kind {
                "counter" if !name.ends_with("_total") => ("_total", "counter"),
                "unknown" => ("", "untyped"),
                // 0.0.4 has no info type: its one sample is a gauge of 1.
                "info" => ("_info", "gauge"),
                other => ("", other),
            };
            if let Some(held) = help.take() {
                push_help(&mut text, held, suffix);
            }
            text.push_str("# TYPE ");
            text.push_str(name);
            text.push_str(suffix);
            text.push(' ');
            text.push_str(kind);
            text.push('\n');
            continue;
        }
        if let Some(held) = help.take() {
            push_help(&mut text, held, "");
        }
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        text.push_str(line);
        text.push('\n');
    }
    if let Some(held) = help {
        push_help(&mut text, held, "");
    }
    text
}

/// Writes `# HELP name<suffix> help` from a `# HELP` line's rest (`name help`).
fn push_help(text: &mut String, rest: &str, suffix: &str) {
    let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
    text.push_str("# HELP ");
    text.push_str(name);
    text.push_str(suffix);
    text.push(' ');
    text.push_str(help);
    text.push('\n');
}

#[cfg(test)]
mod tests;
