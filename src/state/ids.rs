//! Id index: resolves any unique prefix of a 64-hex id, and reports ambiguity.

use std::collections::BTreeSet;

use crate::error::{Error, Result};

#[derive(Debug, Default)]
pub struct IdIndex {
    ids: BTreeSet<String>,
}

impl IdIndex {
    pub fn insert(&mut self, id: &str) {
        self.ids.insert(id.to_string());
    }

    pub fn remove(&mut self, id: &str) {
        self.ids.remove(id);
    }

    /// Resolves `prefix` to the one id it starts; `Ok(None)` if none matches.
    pub fn resolve(&self, prefix: &str) -> Result<Option<String>> {
        crate::validate::id_lookup(prefix)?;
        if crate::validate::id_prefix(prefix).is_err() {
            return Ok(None); // a UUID, a name: matches no id of ours
        }
        let prefix = prefix.to_ascii_lowercase();
        let mut it = self
            .ids
            .range(prefix.clone()..)
            .take_while(|id| id.starts_with(&prefix));
        let first = it.next().cloned();
        let rest = it.count();
        if rest > 0 {
            return Err(Error::Ambiguous {
                prefix,
                count: rest + 1,
            });
        }
        Ok(first)
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// 8 hex chars of FNV-1a: a stable tag, not a security boundary.
pub fn short_hash(s: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        let mut ix = IdIndex::default();
        ix.insert("abc1");
        ix.insert("abc2");
        ix.insert("def0");
        assert_eq!(ix.resolve("d").unwrap().as_deref(), Some("def0"));
        assert_eq!(ix.resolve("abc2").unwrap().as_deref(), Some("abc2"));
        assert!(matches!(
            ix.resolve("ab"),
            Err(Error::Ambiguous { count: 2, .. })
        ));
        assert_eq!(ix.resolve("f").unwrap(), None);
        assert!(ix.resolve("../").is_err());
        assert_eq!(ix.resolve("5c3c1a38-7a5f-4d4b").unwrap(), None);
        assert_eq!(ix.resolve("not-hex").unwrap(), None);
    }
}
