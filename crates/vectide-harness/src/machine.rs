//! What a result file says of the run: the machine, the time, this
//! process's resident set, and parameter values as JSON.

use serde_json::{json, Value};
use vectide_engines::ParamValue;

/// The resident set of this process (`VmRSS`), when the system tells it.
pub fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A parameter value as JSON.
pub fn param_json(v: ParamValue) -> Value {
    match v {
        ParamValue::Int(i) => json!(i),
        ParamValue::Float(f) => json!(f),
        ParamValue::Bool(b) => json!(b),
        ParamValue::Str(s) => json!(s),
    }
}

/// What a native result says of the machine (the Python harness's keys
/// that apply to it, and the SIMD level the kernels dispatched to).
pub fn machine_info() -> Value {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|c| {
        c.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_string())
    });
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    json!({
        "cpu_model": cpu_model,
        "cores": cores,
        "usable_cores": cores,
        "platform": format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
        "simd": vectide_core::distance::active_isa(),
    })
}

/// The current UTC time as ISO 8601 (`2025-01-31T12:00:00+00:00`).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    civil(secs)
}

/// Seconds since the epoch as an ISO 8601 UTC time.
fn civil(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}+00:00",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg:>12} [{bar:30}] {pos}/{len} {elapsed_precise}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil(0), "1970-01-01T00:00:00+00:00");
        // 2000-02-29 (a leap day of a century leap year) 12:34:56.
        assert_eq!(civil(951_827_696), "2000-02-29T12:34:56+00:00");
        assert_eq!(civil(1_798_761_599), "2026-12-31T23:59:59+00:00");
    }

    #[test]
    fn rss_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(rss_bytes().unwrap() > 0);
        }
    }
}
