//! What the commands print: the short ids and ages of the tables, crictl's `-o json` list
//! shape, and verbose answers with their `info` documents shown as JSON.

/// The first 13 characters of an id, as tables show it.
pub fn short(id: &str) -> &str {
    &id[..13.min(id.len())]
}

/// `{"<key>": [items]}` as pretty JSON (crictl's `-o json` shape).
pub fn print_list<T: serde::Serialize>(key: &str, items: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({ key: items })).unwrap()
    );
}

/// How long ago `created_ns` (nanoseconds since the epoch) was, as tables show it.
pub fn ago(created_ns: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    let s = (now - created_ns).max(0) / 1_000_000_000;
    match s {
        0..=59 => format!("{s} seconds ago"),
        60..=3599 => format!("{} minutes ago", s / 60),
        3600..=86399 => format!("{} hours ago", s / 3600),
        _ => format!("{} days ago", s / 86400),
    }
}

/// JSON with the verbose `info` values (JSON documents in strings) shown as JSON.
pub fn pretty_verbose<T: serde::Serialize>(r: &T) -> String {
    let mut v = serde_json::to_value(r).unwrap();
    if let Some(info) = v.get_mut("info").and_then(|i| i.as_object_mut()) {
        for val in info.values_mut() {
            if let Some(parsed) = val
                .as_str()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
            {
                *val = parsed;
            }
        }
    }
    serde_json::to_string_pretty(&v).unwrap()
}
