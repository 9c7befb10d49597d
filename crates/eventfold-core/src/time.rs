//! Timestamp formatting (RFC 3339, UTC) without a clock: values come from records.

/// Formats milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn rfc3339_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (h, min, s) = (sod / 3600, (sod / 60) % 60, sod % 60);
    if !(0..=9999).contains(&y) {
        return format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{millis:03}Z");
    }
    // Digits written in place: `format!` with padding showed in a view rebuild's profile
    // (each order row stores its timestamp).
    let mut out = *b"0000-00-00T00:00:00.000Z";
    for (at, width, v) in [
        (0, 4, y),
        (5, 2, i64::from(m)),
        (8, 2, i64::from(d)),
        (11, 2, h),
        (14, 2, min),
        (17, 2, s),
        (20, 3, millis),
    ] {
        let mut v = v;
        for i in (at..at + width).rev() {
            out[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    }
    String::from_utf8(out.to_vec()).expect("ASCII digits")
}

/// Parses an RFC 3339 instant (`2024-05-01T12:00:00Z`, `2024-05-01T12:00:00.250+02:00`)
/// or a date (`2024-05-01`, midnight UTC) to milliseconds since the Unix epoch. A space
/// may stand for the `T`. Fractions beyond milliseconds are truncated.
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let d = b.get(r)?;
        if d.is_empty() || !d.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(d).ok()?.parse().ok()
    };
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if !(1..=12).contains(&m) || d < 1 || d > days_in_month(y, m) {
        return None;
    }
    let days = days_from_civil(y, m as u32, d as u32);
    if b.len() == 10 {
        return Some(days * 86_400_000);
    }
    if !matches!(b[10], b'T' | b't' | b' ') || b.len() < 19 || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let mut i = 19;
    let mut millis = 0;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return None;
        }
        let frac = &s[start..i.min(start + 3)];
        millis = frac.parse::<i64>().ok()? * 10_i64.pow(3 - frac.len() as u32);
    }
    let offset_min = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if b.len() == i + 6 && b[i + 3] == b':' => {
            let (oh, om) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 60 + om;
            if *sign == b'-' { -o } else { o }
        }
        _ => return None,
    };
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss - offset_min * 60;
    Some(secs * 1000 + millis)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Howard Hinnant's `days_from_civil`: (year, month, day) to days since 1970-01-01.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 to (year, month, day).
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
    #[test]
    fn formats_known_instants() {
        assert_eq!(super::rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(super::rfc3339_ms(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
        assert_eq!(super::rfc3339_ms(253_402_300_800_000), "10000-01-01T00:00:00.000Z");
        assert_eq!(super::rfc3339_ms(1_733_011_205_007), "2024-12-01T00:00:05.007Z");
        assert_eq!(super::rfc3339_ms(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(super::rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn parses_what_it_formats_and_common_forms() {
        use super::parse_rfc3339_ms as p;
        for ms in [0, 1_700_000_000_123, 951_782_400_000, -86_400_001, 4_102_444_800_999] {
            assert_eq!(p(&super::rfc3339_ms(ms)), Some(ms), "{ms}");
        }
        assert_eq!(p("2023-11-14T22:13:20Z"), Some(1_700_000_000_000));
        assert_eq!(p("2023-11-14T23:13:20.5+01:00"), Some(1_700_000_000_500));
        assert_eq!(p("2023-11-14"), Some(1_699_920_000_000));
        for bad in [
            "",
            "2023-13-01",
            "2023-02-29",
            "2023-11-14T25:00:00Z",
            "2023-11-14T22:13:20",
            "yesterday",
        ] {
            assert_eq!(p(bad), None, "{bad:?}");
        }
    }
}
