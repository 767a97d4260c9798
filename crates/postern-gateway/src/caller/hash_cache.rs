//! The executable hashes the gateway remembers, bounded: a same-user process running ever new
//! executables (copies, hard links, `touch`ed files: each a new version) cannot grow it, and
//! cannot flush an agent's hash with a burst of its own as a cache cleared when full would let it.

use std::{collections::HashMap, hash::Hash};

/// How many versions each generation of a [`HashCache`] keeps.
pub(super) const HASHES_KEPT: usize = 256;

/// Hashes by file version in two generations of at most [`HASHES_KEPT`] each: when the newer is
/// full it becomes the older and the older is dropped, and a hit in the older moves back to the
/// newer. An agent's hash is forgotten (its executable then read again, on the blocking pool)
/// only once `HASHES_KEPT` other versions were hashed since its last connection.
#[derive(Debug)]
pub(super) struct HashCache<K> {
    newer: HashMap<K, String>,
    older: HashMap<K, String>,
}

impl<K> Default for HashCache<K> {
    fn default() -> Self {
        HashCache { newer: HashMap::new(), older: HashMap::new() }
    }
}

impl<K: Hash + Eq + Clone> HashCache<K> {
    pub(super) fn get(&mut self, version: &K) -> Option<String> {
        if let Some(hash) = self.newer.get(version) {
            return Some(hash.clone());
        }
        let hash = self.older.remove(version)?;
        self.insert(version.clone(), hash.clone());
        Some(hash)
    }

    pub(super) fn insert(&mut self, version: K, hash: String) {
        if self.newer.len() >= HASHES_KEPT && !self.newer.contains_key(&version) {
            self.older = std::mem::take(&mut self.newer);
        }
        self.newer.insert(version, hash);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.newer.len() + self.older.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst of versions never grows the cache past two generations, and an agent that keeps
    /// connecting while the burst runs keeps its hash; one that stopped is forgotten.
    #[test]
    fn a_burst_of_new_versions_is_bounded_and_does_not_flush_a_recent_agent() {
        let mut cache = HashCache::default();
        cache.insert(u64::MAX, "agent".to_owned());
        cache.insert(u64::MAX - 1, "idle agent".to_owned());
        for version in 0..(10 * HASHES_KEPT as u64) {
            cache.insert(version, version.to_string());
            assert!(cache.len() <= 2 * HASHES_KEPT, "{} kept", cache.len());
            if version % (HASHES_KEPT as u64 / 2) == 0 {
                assert_eq!(cache.get(&u64::MAX).as_deref(), Some("agent"), "after {version}");
            }
        }
        assert_eq!(cache.get(&(u64::MAX - 1)), None);
        assert_eq!(cache.get(&(10 * HASHES_KEPT as u64 - 1)).as_deref(), Some(&*(10 * HASHES_KEPT - 1).to_string()));
    }
}
