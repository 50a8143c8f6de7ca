//! Milliseconds since the epoch as RFC 3339 text, the form every stored and
//! served time takes (`2026-12-06T05:56:00.123Z`).
//!
//! Written by hand for the years 1970 to 9999, which is every time the host
//! makes: an actor batch formats the time two or three times (its summary,
//! its read-model row), and formatting through `jiff`'s `Display` cost
//! ~750 instructions a time (BENCHMARKS.md, "Timers polled only when they
//! fire"). Other times go through `jiff`, as before; a test holds the two
//! equal.

/// The first millisecond of the year 10000.
const YEAR_10000_MS: i64 = 253_402_300_800_000;

const MS_PER_DAY: i64 = 86_400_000;

/// Formats milliseconds since the epoch as RFC 3339 in UTC with
/// milliseconds.
pub fn rfc3339(ms: i64) -> String {
    if !(0..YEAR_10000_MS).contains(&ms) {
        return by_jiff(ms);
    }
    let (days, of_day) = (ms / MS_PER_DAY, ms % MS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute) = (of_day / 3_600_000, of_day / 60_000 % 60);
    let (second, milli) = (of_day / 1000 % 60, of_day % 1000);
    // The separators are in place; each field's digits fill its span.
    let mut text = *b"0000-00-00T00:00:00.000Z";
    let fields = [
        (0..4, year),
        (5..7, month),
        (8..10, day),
        (11..13, hour),
        (14..16, minute),
        (17..19, second),
        (20..23, milli),
    ];
    for (span, value) in fields {
        put(&mut text[span], value);
    }
    // Digits and separators: ASCII, so always UTF-8.
    std::str::from_utf8(&text)
        .map(str::to_owned)
        .unwrap_or_default()
}

/// The same text through `jiff` (`""` past its range).
fn by_jiff(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| format!("{t:.3}"))
        .unwrap_or_default()
}

/// Writes `n` in decimal into `digits`, zero-padded to its length.
fn put(digits: &mut [u8], mut n: i64) {
    for digit in digits.iter_mut().rev() {
        *digit = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// The proleptic Gregorian date of `days` since 1970-01-01, for days that
/// are not negative (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_writes_what_jiff_writes_from_1970_to_9999_and_at_the_edges() {
        // Every day to 2300 and every 97th after it: each day's first and
        // last millisecond, and one in between that moves through the
        // hours, minutes, seconds and milliseconds.
        let mut day = 0;
        while day * MS_PER_DAY < YEAR_10000_MS {
            let start = day * MS_PER_DAY;
            let within = start + (day * 7_919_993) % MS_PER_DAY;
            for ms in [start, within, start + MS_PER_DAY - 1] {
                assert_eq!(rfc3339(ms), by_jiff(ms), "{ms}");
            }
            day += if day < 120_000 { 1 } else { 97 };
        }
        // Outside the hand-written range, jiff's own text.
        for ms in [-1, -MS_PER_DAY, YEAR_10000_MS, YEAR_10000_MS + 1] {
            assert_eq!(rfc3339(ms), by_jiff(ms), "{ms}");
        }
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(YEAR_10000_MS - 1), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(i64::MAX), "");
    }
}
