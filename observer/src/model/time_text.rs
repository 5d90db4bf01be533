//! Writes instants as RFC 3339 text, as alerts, the capture's recording and the daemon's own lines
//! print them.

use super::{NANOS_PER_SEC, wire};

/// Formats Unix nanoseconds as RFC 3339 in UTC with microseconds, `2026-11-30T13:23:52.405857Z`.
pub fn rfc3339(ts_ns: u64) -> String {
    Rfc3339::new(ts_ns).as_str().to_owned()
}

/// Holds RFC 3339 text on the stack, written two digits at a time: every alert prints one or more,
/// and going through a `Display` (humantime's, before) cost about 700 instructions a time.
pub struct Rfc3339([u8; 27]);

impl Rfc3339 {
    /// Writes `ts_ns` (Unix nanoseconds) as RFC 3339 text.
    pub fn new(ts_ns: u64) -> Self {
        let seconds = ts_ns / NANOS_PER_SEC;
        let (year, month, day) = civil_from_days(seconds / 86_400);
        let of_day = seconds % 86_400;
        let micros = ts_ns % NANOS_PER_SEC / 1000;
        let mut text = *b"0000-00-00T00:00:00.000000Z";
        // (where, a value below 100) for each pair of digits.
        let pairs: [(usize, u64); 10] = [
            (0, year / 100 % 100),
            (2, year % 100),
            (5, month),
            (8, day),
            (11, of_day / 3600),
            (14, of_day / 60 % 60),
            (17, of_day % 60),
            (20, micros / 10_000),
            (22, micros / 100 % 100),
            (24, micros % 100),
        ];
        for (start, value) in pairs {
            text[start] = b'0' + (value / 10) as u8;
            text[start + 1] = b'0' + (value % 10) as u8;
        }
        Rfc3339(text)
    }

    /// Returns the text.
    pub fn as_str(&self) -> &str {
        // Only ASCII digits and separators are ever written.
        wire::utf8(&self.0).unwrap_or_default()
    }
}

/// Returns the (year, month, day) of a count of days since 1970-01-01: Howard Hinnant's
/// `civil_from_days`, restricted to dates from the epoch on (u64 nanoseconds end in 2554).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let shifted = days + 719_468;
    let era = shifted / 146_097;
    let day_of_era = shifted % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests;
