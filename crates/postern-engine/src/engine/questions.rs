//! Questions put to a person wait in line: a few at a time per agent run and a bounded number
//! in all. An agent that sends many calls needing approval can neither open a dialog per call
//! nor hold a blocking thread per call (the pool the journal's writes also run on).

use postern_core::SessionId;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Questions one agent run (or one caller without a run) may have open at once; its others
/// wait in line, in the order they came.
pub const QUESTIONS_PER_RUN: usize = 4;

/// Questions open at once for all runs together.
pub const QUESTIONS_IN_ALL: usize = 32;

/// Whose line a question waits in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Asker {
    /// An agent run.
    Run(SessionId),
    /// A caller without a run (`postern call`), by actor.
    Caller(String),
}

type Lines = Arc<Mutex<HashMap<Asker, Arc<Semaphore>>>>;

/// The lines, one per asker with a question open or waiting, and the places open in all.
#[derive(Debug)]
pub(super) struct Questions {
    per_asker: usize,
    in_all: Arc<Semaphore>,
    lines: Lines,
}

impl Default for Questions {
    fn default() -> Self {
        Questions::new(QUESTIONS_PER_RUN, QUESTIONS_IN_ALL)
    }
}

/// A place to ask, held until the question is answered, withdrawn or given up on. Dropping it
/// (or the wait for it) frees the place and forgets an asker with nothing left in line.
#[derive(Debug)]
pub(super) struct Turn {
    asker: Asker,
    lines: Lines,
    line: Option<Arc<Semaphore>>,
    own: Option<OwnedSemaphorePermit>,
    all: Option<OwnedSemaphorePermit>,
}

impl Questions {
    pub(super) fn new(per_asker: usize, in_all: usize) -> Self {
        Questions { per_asker, in_all: Arc::new(Semaphore::new(in_all)), lines: Lines::default() }
    }

    /// Waits (holding no thread) until `asker` may put a question: first a place in its own
    /// line, then one of the places in all.
    pub(super) async fn turn(&self, asker: Asker) -> Turn {
        let line = {
            let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(lines.entry(asker.clone()).or_insert_with(|| Arc::new(Semaphore::new(self.per_asker))))
        };
        let mut turn =
            Turn { asker, lines: Arc::clone(&self.lines), line: Some(Arc::clone(&line)), own: None, all: None };
        // Neither semaphore is ever closed.
        turn.own = line.acquire_owned().await.ok();
        turn.all = Arc::clone(&self.in_all).acquire_owned().await.ok();
        turn
    }

    /// Askers with a question open or waiting.
    #[cfg(test)]
    fn askers(&self) -> usize {
        self.lines.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        self.all.take();
        self.own.take();
        self.line.take();
        // Every holder and waiter keeps a handle on its line (taken under this lock): a line only
        // the map holds has nobody in it.
        if lines.get(&self.asker).is_some_and(|line| Arc::strong_count(line) == 1) {
            lines.remove(&self.asker);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    fn run(n: u128) -> Asker {
        Asker::Run(SessionId::from_parts(postern_core::Timestamp::from_millis(1), n))
    }

    #[tokio::test]
    async fn one_run_waits_in_its_own_line_and_another_run_still_asks() {
        let q = Questions::new(2, 3);
        let a1 = q.turn(run(1)).await;
        let _a2 = q.turn(run(1)).await;
        // A third question of run 1 waits; it holds no place meanwhile.
        let mut a3 = Box::pin(q.turn(run(1)));
        assert!((&mut a3).now_or_never().is_none(), "run 1's third question waits");
        let b1 = q.turn(run(2)).now_or_never().expect("run 2 is not behind run 1");
        // All three places in all are taken: run 3 waits too.
        assert!(Box::pin(q.turn(run(3))).now_or_never().is_none(), "the places in all are bounded");
        drop(a1);
        let _a3 = (&mut a3).now_or_never().expect("run 1's next question goes once one is answered");
        drop(b1);
        assert_eq!(q.askers(), 1, "run 2 and run 3 have nothing left in line");
    }

    #[tokio::test]
    async fn a_wait_given_up_on_leaves_no_line_behind() {
        let q = Questions::new(1, 8);
        let held = q.turn(Asker::Caller("cli".into())).await;
        let waiting = Box::pin(q.turn(Asker::Caller("cli".into())));
        let mut waiting = waiting;
        assert!((&mut waiting).now_or_never().is_none());
        drop(waiting);
        drop(held);
        assert_eq!(q.askers(), 0);
        assert_eq!(q.in_all.available_permits(), 8, "every place is free again");
    }
}
