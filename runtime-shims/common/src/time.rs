//! Timestamps as the CRI log and the exit file carry them: RFC 3339 with nanoseconds, UTC.
//! The monitor writes them; the daemon reads the exit file's back (`finished_at`).

/// Now as RFC 3339 with nanoseconds in UTC, e.g. `2026-11-23T04:05:06.123456789Z`.
pub fn timestamp() -> String {
    // SAFETY: clock_gettime fills the timespec we own.
    let ts = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts);
        ts
    };
    format_rfc3339_nano(ts.tv_sec, ts.tv_nsec as u32)
}

pub fn format_rfc3339_nano(secs: i64, nanos: u32) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Parses what [`format_rfc3339_nano`] writes (UTC, `Z`, up to 9 fraction digits) into
/// nanoseconds since the epoch; `None` for anything else.
pub fn parse_rfc3339_nano(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let rest = s.get(19..)?.strip_suffix('Z')?;
    let nanos = match rest.strip_prefix('.') {
        None if rest.is_empty() => 0,
        Some(f) if (1..=9).contains(&f.len()) && f.bytes().all(|c| c.is_ascii_digit()) => {
            f.parse::<i64>().ok()? * 10i64.pow(9 - f.len() as u32)
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo as u32, d as u32);
    Some((days * 86_400 + h * 3600 + mi * 60 + se) * 1_000_000_000 + nanos)
}

/// (year, month, day) to days since 1970-01-01 (H. Hinnant's algorithm, the inverse of
/// [`civil_from_days`]).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 } as i64;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(format_rfc3339_nano(0, 0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            format_rfc3339_nano(951_782_400, 5),
            "2000-02-29T00:00:00.000000005Z"
        );
        assert_eq!(
            format_rfc3339_nano(1_709_251_199, 999_999_999),
            "2024-02-29T23:59:59.999999999Z"
        );
        assert_eq!(
            format_rfc3339_nano(4_102_444_800, 0),
            "2100-01-01T00:00:00.000000000Z"
        );
    }

    #[test]
    fn timestamps_read_back() {
        for (secs, nanos) in [
            (0i64, 0u32),
            (951_782_400, 5),
            (1_709_251_199, 999_999_999),
            (4_102_444_800, 0),
            (1_795_000_000, 123_456_789),
        ] {
            let s = format_rfc3339_nano(secs, nanos);
            assert_eq!(
                parse_rfc3339_nano(&s),
                Some(secs * 1_000_000_000 + nanos as i64),
                "{s}"
            );
        }
        assert_eq!(
            parse_rfc3339_nano("2024-02-29T23:59:59.5Z"),
            Some(1_709_251_199_500_000_000)
        );
        assert_eq!(
            parse_rfc3339_nano("2024-02-29T23:59:59Z"),
            Some(1_709_251_199_000_000_000)
        );
        for bad in [
            "",
            "2024-02-29 23:59:59Z",
            "2024-02-29T23:59:59",
            "2024-02-29T23:59:59+01:00",
            "2024-13-01T00:00:00Z",
            "2024-02-29T23:59:59.1234567890Z",
            "2024-02-29T23:59:59.Z",
            "２０２４-02-29T23:59:59Z",
            "+024-02-29T23:59:59Z",
        ] {
            assert_eq!(parse_rfc3339_nano(bad), None, "{bad:?}");
        }
    }
}
