//! Timestamps as the CRI log and the exit file carry them: RFC 3339 with nanoseconds, UTC.

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

fn format_rfc3339_nano(secs: i64, nanos: u32) -> String {
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
}
