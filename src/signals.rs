//! Signal names as images (`STOPSIGNAL`) and the CRI (`Signal` enum, KEP-4960) spell them, and
//! the numbers the OCI runtimes are given. One table, x86_64/aarch64 Linux numbering
//! (`RTMIN` is 34 as libc and Go see it: the first two real-time signals belong to libc).

/// Names without `SIG`, and their numbers. Aliases (`CLD`, `IOT`, `POLL`) keep their own name.
const NAMES: &[(&str, i32)] = &[
    ("HUP", 1),
    ("INT", 2),
    ("QUIT", 3),
    ("ILL", 4),
    ("TRAP", 5),
    ("ABRT", 6),
    ("IOT", 6),
    ("BUS", 7),
    ("FPE", 8),
    ("KILL", 9),
    ("USR1", 10),
    ("SEGV", 11),
    ("USR2", 12),
    ("PIPE", 13),
    ("ALRM", 14),
    ("TERM", 15),
    ("STKFLT", 16),
    ("CHLD", 17),
    ("CLD", 17),
    ("CONT", 18),
    ("STOP", 19),
    ("TSTP", 20),
    ("TTIN", 21),
    ("TTOU", 22),
    ("URG", 23),
    ("XCPU", 24),
    ("XFSZ", 25),
    ("VTALRM", 26),
    ("PROF", 27),
    ("WINCH", 28),
    ("IO", 29),
    ("POLL", 29),
    ("PWR", 30),
    ("SYS", 31),
];

const RTMIN: i32 = 34;
const RTMAX: i32 = 64;

/// The canonical name (no `SIG`, upper case: `TERM`, `RTMIN+3`, `RTMAX-1`) of a signal given
/// as a name (`SIGTERM`, `term`, `SIGRTMIN+3`) or a number (`15`), or `None` if it is none.
/// An alias keeps its own name (`SIGCLD` is `CLD`).
pub fn canonical(given: &str) -> Option<String> {
    let n = number(given)?;
    let upper = given.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    match NAMES.iter().find(|(name, _)| *name == bare) {
        Some((name, _)) => Some((*name).to_string()),
        None => name_of(n),
    }
}

/// The number of a canonical or given name.
pub fn number(given: &str) -> Option<i32> {
    let g = given.trim();
    if let Ok(n) = g.parse::<i32>() {
        return (1..=RTMAX).contains(&n).then_some(n);
    }
    let upper = g.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    if let Some((_, n)) = NAMES.iter().find(|(n, _)| *n == bare) {
        return Some(*n);
    }
    let rt = |base: i32, rest: &str| -> Option<i32> {
        let n = match rest {
            "" => base,
            r => {
                let (sign, k) = r.split_at(1);
                let k: i32 = k.parse().ok()?;
                match sign {
                    "+" => base.checked_add(k)?,
                    "-" => base.checked_sub(k)?,
                    _ => return None,
                }
            }
        };
        (RTMIN..=RTMAX).contains(&n).then_some(n)
    };
    if let Some(rest) = bare.strip_prefix("RTMIN") {
        return rt(RTMIN, rest);
    }
    if let Some(rest) = bare.strip_prefix("RTMAX") {
        return rt(RTMAX, rest);
    }
    None
}

/// The canonical name of signal number `n`.
fn name_of(n: i32) -> Option<String> {
    if let Some((name, _)) = NAMES.iter().find(|(_, v)| *v == n) {
        return Some((*name).to_string());
    }
    match n {
        RTMIN => Some("RTMIN".into()),
        RTMAX => Some("RTMAX".into()),
        n if (RTMIN..RTMIN + 16).contains(&n) => Some(format!("RTMIN+{}", n - RTMIN)),
        n if (RTMIN + 16..RTMAX).contains(&n) => Some(format!("RTMAX-{}", RTMAX - n)),
        _ => None,
    }
}

/// The CRI `Signal` enum's name for a canonical name: `SIGNAL_SIGTERM`, `SIGNAL_SIGRTMINPLUS3`.
pub fn cri_name(canonical: &str) -> String {
    format!(
        "SIGNAL_SIG{}",
        canonical.replace('+', "PLUS").replace('-', "MINUS")
    )
}

/// The name for a CRI `Signal` enum name (`SIGNAL_SIGTERM` → `TERM`; aliases kept).
pub fn from_cri_name(cri: &str) -> Option<String> {
    let spelled = cri
        .strip_prefix("SIGNAL_SIG")?
        .replace("PLUS", "+")
        .replace("MINUS", "-");
    number(&spelled)?;
    Some(spelled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers() {
        assert_eq!(canonical("SIGTERM").as_deref(), Some("TERM"));
        assert_eq!(canonical("term").as_deref(), Some("TERM"));
        assert_eq!(canonical("15").as_deref(), Some("TERM"));
        assert_eq!(canonical("SIGCLD").as_deref(), Some("CLD"));
        assert_eq!(canonical("SIGRTMIN+3").as_deref(), Some("RTMIN+3"));
        assert_eq!(canonical("RTMAX-1").as_deref(), Some("RTMAX-1"));
        assert_eq!(canonical("RTMIN+30").as_deref(), Some("RTMAX"));
        assert_eq!(number("RTMIN+3"), Some(37));
        assert_eq!(number("SIGRTMAX"), Some(64));
        assert_eq!(number("KILL"), Some(9));
        for bad in [
            "SIGBOGUS", "", "0", "65", "-1", "RTMIN+31", "RTMAX+1", "RTMIN-1", "SIG",
        ] {
            assert_eq!(canonical(bad), None, "{bad}");
            assert_eq!(number(bad), None, "{bad}");
        }
    }

    #[test]
    fn every_cri_enum_name_round_trips() {
        for n in 1..=RTMAX {
            let Some(c) = name_of(n) else {
                assert!((32..RTMIN).contains(&n), "{n} has no name");
                continue;
            };
            let e = cri_name(&c);
            assert!(
                crate::api::v1::Signal::from_str_name(&e).is_some(),
                "{e} is not in the CRI enum"
            );
            assert_eq!(from_cri_name(&e).as_deref(), Some(c.as_str()));
        }
        for alias in ["CLD", "IOT", "POLL"] {
            let e = cri_name(alias);
            assert!(crate::api::v1::Signal::from_str_name(&e).is_some(), "{e}");
            assert_eq!(from_cri_name(&e).as_deref(), Some(alias));
        }
    }
}
