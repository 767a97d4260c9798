//! Questions put to a person wait in line: a few at a time per agent and a bounded number in
//! all (fewer if the approver shows fewer at once). An agent that sends many calls needing
//! approval, from one run or from many, can neither open a dialog per call nor hold a blocking
//! thread per call (the pool the journal's writes also run on).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Questions one agent (actor: an executable and its hash, or a token's agent) may have open
/// at once, over all its runs; its others wait in line, in the order they came. A run costs an
/// agent nothing to start (each bridge process is one), so the line is the agent's, not a run's.
pub const QUESTIONS_PER_AGENT: usize = 4;

pub use crate::approval::QUESTIONS_IN_ALL;

/// Whose line a question waits in: the calling agent's (its actor).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Asker(pub(super) String);

type Lines = Arc<Mutex<HashMap<Asker, Arc<Semaphore>>>>;

/// The lines, one per asker with a question open or waiting, and the places open in all.
#[derive(Debug)]
pub(super) struct Questions {
    per_asker: usize,
    in_all: Arc<Semaphore>,
    lines: Lines,
}

impl Questions {
    /// The line for an approver that shows `at_once` questions at a time.
    pub(super) fn for_approver(at_once: usize) -> Self {
        let in_all = at_once.clamp(1, QUESTIONS_IN_ALL);
        Questions::new(QUESTIONS_PER_AGENT.min(in_all), in_all)
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
        Asker(format!("process:/usr/bin/agent-{n}@sha256:ab"))
    }

    #[tokio::test]
    async fn one_agent_waits_in_its_own_line_and_another_agent_still_asks() {
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
        let held = q.turn(Asker("cli".into())).await;
        let waiting = Box::pin(q.turn(Asker("cli".into())));
        let mut waiting = waiting;
        assert!((&mut waiting).now_or_never().is_none());
        drop(waiting);
        drop(held);
        assert_eq!(q.askers(), 0);
        assert_eq!(q.in_all.available_permits(), 8, "every place is free again");
    }
}

#[cfg(test)]
mod approver_tests {
    use super::*;

    #[test]
    fn a_terminal_shows_one_question_at_a_time() {
        let one = Questions::for_approver(1);
        assert_eq!((one.per_asker, one.in_all.available_permits()), (1, 1));
        let many = Questions::for_approver(usize::MAX);
        assert_eq!((many.per_asker, many.in_all.available_permits()), (QUESTIONS_PER_AGENT, QUESTIONS_IN_ALL));
    }
}
