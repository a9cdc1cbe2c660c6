//! Name reservation: a pod or container name belongs to exactly one id until released.

use std::collections::HashMap;

use crate::error::{Error, Result};

#[derive(Debug, Default)]
pub struct NameReservations {
    by_name: HashMap<String, String>,
}

impl NameReservations {
    /// Reserves `name` for `id`. Reserving again for the same id is a no-op; for another id it
    /// fails naming the holder.
    pub fn reserve(&mut self, name: &str, id: &str) -> Result<()> {
        match self.by_name.get(name) {
            Some(holder) if holder == id => Ok(()),
            Some(holder) => Err(Error::NameReserved {
                name: name.to_string(),
                holder: holder.clone(),
            }),
            None => {
                self.by_name.insert(name.to_string(), id.to_string());
                Ok(())
            }
        }
    }

    /// The id holding `name`, if any.
    pub fn holder(&self, name: &str) -> Option<&str> {
        self.by_name.get(name).map(String::as_str)
    }

    /// Releases `name` if `id` holds it (a stale release never frees another id's name).
    pub fn release(&mut self, name: &str, id: &str) {
        if self.by_name.get(name).is_some_and(|h| h == id) {
            self.by_name.remove(name);
        }
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_release() {
        let mut n = NameReservations::default();
        n.reserve("a", "1").unwrap();
        n.reserve("a", "1").unwrap();
        let e = n.reserve("a", "2").unwrap_err();
        assert!(e.to_string().contains('1'), "{e}");
        n.release("a", "2");
        assert_eq!(n.holder("a"), Some("1"));
        n.release("a", "1");
        n.reserve("a", "2").unwrap();
    }
}
