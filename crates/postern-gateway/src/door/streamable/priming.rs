//! A `tools/call` stream's priming event and a quick answer in one write. The event (an ID to
//! resume with, no data) goes first on every such stream; sent the moment the stream opens, it
//! cost the connection a write of its own before the answer's, on every call. Now the stream's
//! head and event wait for the answer for one to two ticks of a clock the streams share
//! ([`Ticks`]), and go alone once the call has taken longer than that, or at once when the call
//! is bound to an execution (a call with an effect, its admission on record: it goes out before
//! anything is sent, as before). A read-only call is never bound: a retry reads again.

use axum::{
    body::{Body, Bytes},
    response::Response,
};
use http_body::{Body as _, Frame};
use std::{
    collections::VecDeque,
    pin::Pin,
    task::{Context, Poll},
};

/// A primed stream waits for the frame after its event for one to two ticks before the event
/// goes alone: longer than a quick call takes under load on a laptop, short beside a call that
/// waits for anything (an approval, a slow target), whose stream then opens as before.
pub const TICK: std::time::Duration = std::time::Duration::from_millis(10);

/// The clock the waiting streams share: one timer ticking every [`TICK`] while any stream waits,
/// none while none does. A timer of each stream's own cost the runtime a wake-up of its driver
/// on most calls (measured at 8 sessions: 0.3 `eventfd` writes and 0.35 `futex` calls more per
/// call than no timer at all).
#[derive(Debug)]
pub struct Ticks {
    state: std::sync::Arc<std::sync::Mutex<TickState>>,
    tick: tokio::sync::watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct TickState {
    waiting: usize,
    ticking: bool,
}

impl Default for Ticks {
    fn default() -> Self {
        Ticks { state: std::sync::Arc::default(), tick: tokio::sync::watch::Sender::new(0) }
    }
}

impl Ticks {
    /// Returns once the clock has ticked twice from now: between one and two [`TICK`]s.
    async fn two_ticks(&self) {
        let mut ticks = self.tick.subscribe();
        let from = *ticks.borrow_and_update();
        let _waiting = self.wait();
        loop {
            // The sender is this clock's own: it outlives every wait on it.
            if ticks.changed().await.is_err() || *ticks.borrow_and_update() >= from + 2 {
                return;
            }
        }
    }

    /// Counts a waiter in, and starts the ticking if nothing ticks.
    fn wait(&self) -> Waiting {
        let start = {
            let Ok(mut state) = self.state.lock() else { return Waiting(None) };
            state.waiting += 1;
            !std::mem::replace(&mut state.ticking, true)
        };
        if start {
            let (state, tick) = (std::sync::Arc::clone(&self.state), self.tick.clone());
            tokio::spawn(async move {
                // Ticking ends with this task, however it ends (the runtime shutting down too).
                let _ticking = Ticking(std::sync::Arc::clone(&state));
                let mut every = tokio::time::interval_at(tokio::time::Instant::now() + TICK, TICK);
                loop {
                    every.tick().await;
                    tick.send_modify(|n| *n += 1);
                    if state.lock().map_or(true, |s| s.waiting == 0) {
                        return;
                    }
                }
            });
        }
        Waiting(Some(std::sync::Arc::clone(&self.state)))
    }
}

/// One stream waiting on the clock, until dropped.
struct Waiting(Option<std::sync::Arc<std::sync::Mutex<TickState>>>);

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(state) = &self.0
            && let Ok(mut state) = state.lock()
        {
            state.waiting -= 1;
        }
    }
}

/// The ticking task, until dropped.
struct Ticking(std::sync::Arc<std::sync::Mutex<TickState>>);

impl Drop for Ticking {
    fn drop(&mut self) {
        if let Ok(mut state) = self.0.lock() {
            state.ticking = false;
        }
    }
}

type Polled = Result<Frame<Bytes>, axum::Error>;

/// `response` (its first frame the priming event) once the frame after the event is ready too,
/// the call is bound to an execution (`told`), or two of `ticks` have passed. Two data frames
/// are joined into one, so the connection writes the head, the event and the answer together.
/// The body is never read past those two frames here: the frame after an answer is how the
/// delivery body learns the connection took it.
pub async fn with_quick_answer(
    response: Response,
    ticks: &Ticks,
    mut told: tokio::sync::watch::Receiver<Option<postern_core::ExecutionId>>,
) -> Response {
    let (parts, mut body) = response.into_parts();
    let mut held: VecDeque<Polled> = VecDeque::with_capacity(2);
    let mut ended = false;
    let alone = ticks.two_ticks();
    tokio::pin!(alone);
    let told = async {
        // Nobody left to tell it (the call ended unbound): only the answer or the clock now.
        if told.wait_for(Option::is_some).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(told);
    while held.len() < 2 && !ended {
        let next = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx));
        tokio::select! {
            biased;
            frame = next => match frame {
                Some(frame) => {
                    let failed = frame.is_err();
                    held.push_back(frame);
                    if failed {
                        break;
                    }
                }
                None => ended = true,
            },
            () = &mut told => break,
            () = &mut alone => break,
        }
    }
    if let [Ok(first), Ok(second)] = held.make_contiguous()
        && let (Some(first), Some(second)) = (first.data_ref(), second.data_ref())
    {
        let mut joined = Vec::with_capacity(first.len() + second.len());
        joined.extend_from_slice(first);
        joined.extend_from_slice(second);
        held.clear();
        held.push_back(Ok(Frame::data(Bytes::from(joined))));
    }
    Response::from_parts(parts, Body::new(Held { held, ended, inner: body }))
}

/// A body whose first frames were read ahead: those, then the rest of `inner`.
struct Held {
    held: VecDeque<Polled>,
    /// `inner` ended while its first frames were read.
    ended: bool,
    inner: Body,
}

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Polled>> {
        if let Some(frame) = self.held.pop_front() {
            return Poll::Ready(Some(frame));
        }
        if self.ended {
            return Poll::Ready(None);
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    // As the delivery body inside: never the end early, never an exact length (the connection
    // must poll past the last frame).
    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body that yields `frames` one poll apart, then ends, counting how often it was polled.
    struct Paced {
        frames: VecDeque<(bool, &'static str)>,
        polls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        gate: Option<tokio::sync::oneshot::Receiver<()>>,
    }

    impl http_body::Body for Paced {
        type Data = Bytes;
        type Error = axum::Error;

        fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Polled>> {
            self.polls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            match self.frames.front() {
                // A frame behind the gate waits for it.
                Some((true, _)) => {
                    if let Some(gate) = self.gate.as_mut() {
                        match Pin::new(gate).poll(cx) {
                            Poll::Pending => return Poll::Pending,
                            Poll::Ready(_) => self.gate = None,
                        }
                    }
                }
                Some((false, _)) => {}
                None => return Poll::Ready(None),
            }
            let (_, text) = self.frames.pop_front().unwrap_or_default();
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(text.as_bytes())))))
        }
    }

    use std::future::Future as _;

    fn paced(
        frames: &[(bool, &'static str)],
    ) -> (Response, std::sync::Arc<std::sync::atomic::AtomicUsize>, tokio::sync::oneshot::Sender<()>) {
        let polls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (open, gate) = tokio::sync::oneshot::channel();
        let body = Paced { frames: frames.iter().copied().collect(), polls: polls.clone(), gate: Some(gate) };
        (Response::new(Body::new(body)), polls, open)
    }

    /// The binding of a call that ends unbound (a read-only call's).
    fn unbound() -> tokio::sync::watch::Receiver<Option<postern_core::ExecutionId>> {
        postern_engine::Bound::default().watch()
    }

    /// A call bound to an execution (one with an effect, its admission on record) has its event
    /// go at once, alone, before anything is sent: a stream that breaks while it runs resumes.
    #[tokio::test(start_paused = true)]
    async fn a_bound_call_sends_its_event_at_once() {
        let (response, _polls, open) = paced(&[(false, "event;"), (true, "answer;")]);
        let (bind, bound) = tokio::sync::watch::channel(None);
        let ticks = Ticks::default();
        let started = tokio::time::Instant::now();
        let waiting = tokio::spawn(async move { with_quick_answer(response, &ticks, bound).await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "no answer, not bound: the event waits");
        bind.send_replace(Some("act_01ARZ3NDEKTSV4RRFFQ69G5FAV".parse().unwrap()));
        let response = waiting.await.unwrap();
        assert_eq!(started.elapsed(), std::time::Duration::ZERO);
        slow_answer_follows(response, open).await;
    }

    async fn frames_of(response: Response) -> Vec<String> {
        let mut body = response.into_body();
        let mut out = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            out.push(String::from_utf8(frame.unwrap().into_data().unwrap().to_vec()).unwrap());
        }
        out
    }

    /// A quick answer goes in one frame with the event, and the body is read no further than
    /// the answer until the connection asks for more.
    #[tokio::test(start_paused = true)]
    async fn a_quick_answer_goes_with_the_event_in_one_frame() {
        let (response, polls, _open) = paced(&[(false, "event;"), (false, "answer;"), (false, "tail;")]);
        let response = with_quick_answer(response, &Ticks::default(), unbound()).await;
        assert_eq!(polls.load(std::sync::atomic::Ordering::SeqCst), 2, "read up to the answer, not past it");
        assert_eq!(frames_of(response).await, ["event;answer;", "tail;"]);
    }

    /// An answer that takes longer than two ticks finds the event gone ahead alone; the clock
    /// stops once nothing waits, and starts again for the next stream.
    #[tokio::test(start_paused = true)]
    async fn a_slow_answer_lets_the_event_go_alone() {
        let ticks = Ticks::default();
        for _ in 0..2 {
            let (response, _polls, open) = paced(&[(false, "event;"), (true, "answer;")]);
            let started = tokio::time::Instant::now();
            let response = with_quick_answer(response, &ticks, unbound()).await;
            assert_eq!(started.elapsed(), 2 * TICK);
            slow_answer_follows(response, open).await;
            // The clock ticks once more, finds nobody waiting, and stops.
            tokio::time::sleep(2 * TICK).await;
            assert!(!ticks.state.lock().unwrap().ticking);
            assert_eq!(ticks.state.lock().unwrap().waiting, 0);
        }
    }

    async fn slow_answer_follows(response: Response, open: tokio::sync::oneshot::Sender<()>) {
        let mut body = response.into_body();
        let first = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "event;");
        open.send(()).unwrap();
        let second = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await.unwrap().unwrap();
        assert_eq!(second.into_data().unwrap(), "answer;");
        assert!(std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await.is_none());
    }

    /// A stream that ends after its event ends after it, and says so only when polled past it.
    #[tokio::test(start_paused = true)]
    async fn a_stream_that_ends_early_still_ends() {
        let (response, _polls, _open) = paced(&[(false, "event;")]);
        let response = with_quick_answer(response, &Ticks::default(), unbound()).await;
        assert!(!response.body().is_end_stream());
        assert_eq!(frames_of(response).await, ["event;"]);
    }
}
