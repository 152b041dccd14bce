//! The table of calls waiting for their results: a slab indexed by the low half of a call id,
//! with the slot's generation in the high half. Looking a call up is an index and a compare
//! (no hashing on the call path), and a late or forged result for a finished call finds
//! another generation and is refused. Ids are never 0 (generations start at 1).

/// Calls in flight, by id.
pub(crate) struct CallTable<T> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
}

struct Entry<T> {
    generation: u32,
    value: Option<T>,
}

impl<T> Default for CallTable<T> {
    fn default() -> Self {
        CallTable { entries: Vec::new(), free: Vec::new() }
    }
}

impl<T> CallTable<T> {
    /// Stores `value` and returns its id.
    pub fn insert(&mut self, value: T) -> u64 {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.entries.push(Entry { generation: 1, value: None });
                (self.entries.len() - 1) as u32
            }
        };
        let e = &mut self.entries[index as usize];
        e.value = Some(value);
        (e.generation as u64) << 32 | index as u64
    }

    fn entry(&mut self, id: u64) -> Option<&mut Entry<T>> {
        let e = self.entries.get_mut(id as u32 as usize)?;
        (e.generation == (id >> 32) as u32).then_some(e)
    }

    /// The value of call `id`, if it is in flight.
    pub fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        self.entry(id)?.value.as_mut()
    }

    /// Takes call `id` out of the table; its slot is reused under a new generation.
    pub fn remove(&mut self, id: u64) -> Option<T> {
        let e = self.entry(id)?;
        let v = e.value.take()?;
        e.generation = e.generation.wrapping_add(1).max(1);
        self.free.push(id as u32);
        Some(v)
    }

    /// The calls in flight.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.entries.iter_mut().filter_map(|e| e.value.as_mut())
    }

    /// Calls in flight.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_stale_ids_are_refused() {
        let mut t = CallTable::default();
        let a = t.insert("a");
        let b = t.insert("b");
        assert!(a != 0 && b != 0 && a != b);
        assert_eq!(t.remove(a), Some("a"));
        assert_eq!(t.remove(a), None, "removed twice");
        let c = t.insert("c");
        assert_eq!(c as u32, a as u32, "the slot is reused");
        assert_ne!(c, a, "under a new generation");
        assert_eq!(t.get_mut(a), None, "a stale id finds nothing");
        assert_eq!(t.get_mut(c), Some(&mut "c"));
        assert_eq!(t.get_mut(u64::MAX), None);
        assert_eq!(t.len(), 2);
    }
}
