//! The executable hashes the gateway remembers, bounded: a same-user process running ever new
//! executables (copies, hard links, `touch`ed files: each a new version) cannot grow it, and
//! cannot flush an agent's hash with a burst of its own as a cache cleared when full would let it.

use std::{
    collections::HashMap,
    hash::Hash,
    sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError},
    time::{Duration, Instant},
};

/// How many versions each generation of a [`HashCache`] keeps.
pub(super) const HASHES_KEPT: usize = 256;

/// How long a connection waits for another's read of the same version before it gives up
/// (its process is then not described, as for an unreadable executable). A read that hangs (a
/// file system that never answers) holds its own blocking thread, not every waiter's for ever.
const READ_WAIT: Duration = Duration::from_secs(30);

/// Hashes by file version in two generations of at most [`HASHES_KEPT`] each: when the newer is
/// full it becomes the older and the older is dropped, and a hit in the older moves back to the
/// newer. An agent's hash is forgotten (its executable then read again, on the blocking pool)
/// only once `HASHES_KEPT` other versions were hashed since its last connection.
///
/// A version is read once however many connections ask for it at once (an agent opening eight
/// sessions as it starts): the first reads, the others wait (at most [`READ_WAIT`]) for its
/// outcome, an unreadable one included, and share it.
#[derive(Debug)]
pub(super) struct HashCache<K> {
    state: Mutex<Generations<K>>,
    /// Told when a read ends.
    read_ended: Condvar,
    /// How long a waiter waits for another's read.
    read_wait: Duration,
}

/// A read's outcome, set once when it ends: the hash, or `None` (unreadable, or the read panicked).
type ReadOutcome = Arc<OnceLock<Option<String>>>;

#[derive(Debug)]
struct Generations<K> {
    newer: HashMap<K, String>,
    older: HashMap<K, String>,
    /// Versions being read now, each with the outcome its waiters will share.
    reading: HashMap<K, ReadOutcome>,
}

impl<K> Default for HashCache<K> {
    fn default() -> Self {
        HashCache::waiting(READ_WAIT)
    }
}

impl<K> HashCache<K> {
    fn waiting(read_wait: Duration) -> Self {
        let state = Generations { newer: HashMap::new(), older: HashMap::new(), reading: HashMap::new() };
        HashCache { state: Mutex::new(state), read_ended: Condvar::new(), read_wait }
    }
}

impl<K: Hash + Eq + Clone> Generations<K> {
    fn get(&mut self, version: &K) -> Option<String> {
        if let Some(hash) = self.newer.get(version) {
            return Some(hash.clone());
        }
        let hash = self.older.remove(version)?;
        self.insert(version.clone(), hash.clone());
        Some(hash)
    }

    fn insert(&mut self, version: K, hash: String) {
        if self.newer.len() >= HASHES_KEPT && !self.newer.contains_key(&version) {
            self.older = std::mem::take(&mut self.newer);
        }
        self.newer.insert(version, hash);
    }
}

impl<K: Hash + Eq + Clone> HashCache<K> {
    /// The critical sections below cannot panic half-way, so a poisoned lock's state is whole.
    fn state(&self) -> MutexGuard<'_, Generations<K>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The kept hash of `version`, without reading anything.
    pub(super) fn get(&self, version: &K) -> Option<String> {
        self.state().get(version)
    }

    /// The hash of `version`: the kept one, or the one `read` gives on this thread (`None`:
    /// unreadable, nothing kept). Another thread asking for a version being read waits for that
    /// read's outcome and shares it (so N waiters on a failing read wait for one failure, not N
    /// in turn); after [`READ_WAIT`] it gives up with `None`.
    /// Call it where blocking is allowed (the blocking pool): it may wait for another read.
    pub(super) fn get_or_read(&self, version: K, read: impl FnOnce() -> Option<String>) -> Option<String> {
        let mut state = self.state();
        if let Some(hash) = state.get(&version) {
            return Some(hash);
        }
        if let Some(outcome) = state.reading.get(&version).cloned() {
            let until = Instant::now() + self.read_wait;
            loop {
                // Set under the lock (see `Reading`'s drop), so no wakeup is missed between here
                // and the wait.
                if let Some(hash) = outcome.get() {
                    return hash.clone();
                }
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                state = self.read_ended.wait_timeout(state, left).unwrap_or_else(PoisonError::into_inner).0;
            }
        }
        let outcome = ReadOutcome::default();
        state.reading.insert(version.clone(), Arc::clone(&outcome));
        drop(state);
        // Ends the read when dropped, even if `read` panics, so that no waiter waits for ever.
        let mut reading = Reading { cache: self, version, outcome, hash: None };
        reading.hash = read();
        reading.hash.clone()
    }

    /// How many threads wait for the read of `version` under way.
    #[cfg(test)]
    fn waiting_for(&self, version: &K) -> usize {
        // The map's and the reader's own references are not waiters.
        self.state().reading.get(version).map_or(0, |outcome| Arc::strong_count(outcome) - 2)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let state = self.state();
        state.newer.len() + state.older.len()
    }
}

/// A read of one version under way; dropped, it ends: the version is no longer being read, its
/// hash (if the read gave one) is kept, and the waiters are handed its outcome.
struct Reading<'a, K: Hash + Eq + Clone> {
    cache: &'a HashCache<K>,
    version: K,
    outcome: ReadOutcome,
    hash: Option<String>,
}

impl<K: Hash + Eq + Clone> Drop for Reading<'_, K> {
    fn drop(&mut self) {
        let mut state = self.cache.state();
        state.reading.remove(&self.version);
        let hash = self.hash.take();
        if let Some(hash) = &hash {
            state.insert(self.version.clone(), hash.clone());
        }
        // Only this read sets its outcome, once.
        let _ = self.outcome.set(hash);
        drop(state);
        self.cache.read_ended.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst of versions never grows the cache past two generations, and an agent that keeps
    /// connecting while the burst runs keeps its hash; one that stopped is forgotten.
    #[test]
    fn a_burst_of_new_versions_is_bounded_and_does_not_flush_a_recent_agent() {
        let cache = HashCache::default();
        let keep = |version: u64, hash: &str| cache.get_or_read(version, || Some(hash.to_owned()));
        keep(u64::MAX, "agent");
        keep(u64::MAX - 1, "idle agent");
        for version in 0..(10 * HASHES_KEPT as u64) {
            keep(version, &version.to_string());
            assert!(cache.len() <= 2 * HASHES_KEPT, "{} kept", cache.len());
            if version % (HASHES_KEPT as u64 / 2) == 0 {
                assert_eq!(cache.get(&u64::MAX).as_deref(), Some("agent"), "after {version}");
            }
        }
        assert_eq!(cache.get(&(u64::MAX - 1)), None);
        assert_eq!(cache.get(&(10 * HASHES_KEPT as u64 - 1)).as_deref(), Some(&*(10 * HASHES_KEPT - 1).to_string()));
    }

    /// Eight threads asking for `version` at once, each answer and how many reads were made.
    fn ask_at_once(cache: &HashCache<u64>, version: u64, hash: Option<&str>) -> (Vec<Option<String>>, usize) {
        let reads = std::sync::atomic::AtomicUsize::new(0);
        let start = std::sync::Barrier::new(8);
        let answers = std::thread::scope(|scope| {
            let asks: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        cache.get_or_read(version, || {
                            reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            // The read ends only once the seven others wait for it (each holds
                            // its outcome), however slowly they start.
                            while cache.waiting_for(&version) < 7 {
                                std::thread::sleep(std::time::Duration::from_millis(1));
                            }
                            hash.map(str::to_owned)
                        })
                    })
                })
                .collect();
            asks.into_iter().map(|a| a.join().unwrap()).collect()
        });
        (answers, reads.into_inner())
    }

    /// Eight threads asking for one version at once: one reads it, all get its hash; an
    /// unreadable version is read once too, all are told so, and it is kept for nobody; a read
    /// that panics leaves no one waiting.
    #[test]
    fn a_version_asked_for_at_once_is_read_once() {
        let cache = HashCache::default();
        let (answers, reads) = ask_at_once(&cache, 7, Some("hash"));
        assert_eq!(reads, 1);
        assert!(answers.iter().all(|a| a.as_deref() == Some("hash")), "{answers:?}");

        let (answers, reads) = ask_at_once(&cache, 8, None);
        assert_eq!(reads, 1, "waiters share a failed read's outcome, they do not each read again");
        assert!(answers.iter().all(Option::is_none), "{answers:?}");
        assert_eq!(cache.get(&8), None, "nothing kept for an unreadable version");

        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cache.get_or_read(9, || panic!("read failed"));
        }));
        assert!(panicked.is_err());
        assert_eq!(cache.get_or_read(9, || Some("again".to_owned())).as_deref(), Some("again"));
    }

    /// A read that never ends (a file system that never answers) holds its own thread only: a
    /// connection waiting for the same version gives up, and one asking for another version is
    /// not held at all. Once the read ends, its hash is kept.
    #[test]
    fn a_waiter_gives_up_on_a_read_that_hangs() {
        let cache = HashCache::waiting(std::time::Duration::from_millis(50));
        let (started, reading) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|scope| {
            let cache = &cache;
            let reader = scope.spawn(move || {
                cache.get_or_read(1u64, move || {
                    started.send(()).unwrap();
                    released.recv().unwrap();
                    Some("slow".to_owned())
                })
            });
            reading.recv().unwrap();
            let (answered, answer) = std::sync::mpsc::channel();
            scope
                .spawn(move || answered.send(cache.get_or_read(1, || panic!("a second read of a version being read"))));
            // A wait without its bound would end only with the read: a failure, not a hang.
            let waited = answer.recv_timeout(std::time::Duration::from_secs(30));
            assert_eq!(cache.get_or_read(2, || Some("other".to_owned())).as_deref(), Some("other"));
            release.send(()).unwrap();
            assert_eq!(waited, Ok(None), "the waiter gave up while the read still ran");
            assert_eq!(reader.join().unwrap().as_deref(), Some("slow"));
        });
        assert_eq!(cache.get(&1).as_deref(), Some("slow"));
    }
}
