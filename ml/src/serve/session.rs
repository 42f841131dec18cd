//! One decode session of `rredcot serve`: continuous batching across requests. The session takes
//! the jobs at the head of the queue, one row (choice) per free slot, each row with its own
//! `max_tokens`, stop rules and sampling distribution (a CUDA-graph decode takes jobs of the
//! session's distribution only); requests that arrive meanwhile are routed after each read-back
//! (what needs no generation, such as `/health`, is answered there, even while every slot
//! decodes) and join while they fit the session's cache; each request is answered as soon as its
//! last row ends (a streamed one sends each choice's text after every read-back, and each
//! choice's end as it ends). A job whose client has gone (a timeout, a stopped stream) stops
//! decoding at the next read-back, or is dropped while it waits. A job with too long a prompt and
//! budget (or another distribution under CUDA graphs) waits at the head, and nothing overtakes
//! it: the session drains and the next one starts with it.

use std::collections::VecDeque;
use std::time::Duration;

use super::front::Front;
use super::{fail, Job, State};
use crate::model::{self, FedRow, Generation, RowFeed, SamplingParams, StopRules};

impl State {
    /// Whether a job sampling with `a` can join a session begun with `b`. Budgets and stop rules
    /// are each row's own, and so is the distribution on the eager steps (the CPU's); a
    /// captured CUDA-graph step samples from one.
    fn joins(&self, a: &SamplingParams, b: &SamplingParams) -> bool {
        model::fed_rows_may_mix_distributions(self.model().device()) || model::same_distribution(a, b)
    }
}

/// Prompt lengths are rounded up to this many tokens when a session sizes its cache, so that
/// requests of about the same length as the first ones can still join.
const PROMPT_ROUNDING: usize = 256;

/// Token budgets (`max_tokens`) are rounded up to this many, for the same reason.
const BUDGET_ROUNDING: usize = 64;

/// A job taken into the session, its choices filled in as they end.
struct Running {
    job: Job,
    gens: Vec<Option<Generation>>,
}

/// The session's side of [`RowFeed`].
struct Feed<'a> {
    state: &'a State,
    front: &'a Front,
    queue: &'a mut VecDeque<Job>,
    sampling: &'a SamplingParams,
    /// Most prompt + new tokens a row may have.
    fits: usize,
    /// Jobs taken (answered ones are `None`), each row's job and choice, and the job being fed
    /// with its next choice.
    running: Vec<Option<Running>>,
    rows: Vec<(usize, usize)>,
    current: Option<(usize, usize)>,
    /// The head of the queue cannot join: take no more jobs.
    closed: bool,
}

impl Feed<'_> {
    /// Routes the requests that came since the last look (what needs no generation is answered
    /// at once), and drops the waiting ones whose client has gone.
    fn take_arrivals(&mut self) {
        while let Ok(Some(r)) = self.front.recv_timeout(Duration::ZERO) {
            self.queue.extend(self.state.route(r));
        }
        drop_gone(self.queue);
    }

    /// Whether the job at the head of the queue can join the session.
    fn head_joins(&self) -> bool {
        self.queue.front().is_some_and(|j| self.state.joins(&j.sampling, self.sampling) && j.prompt.len() + j.sampling.max_new_tokens <= self.fits)
    }
}

impl RowFeed for Feed<'_> {
    fn next_row(&mut self) -> Option<FedRow> {
        self.take_arrivals();
        // The next choice of the job being fed, else the head of the queue if it joins (n >= 1).
        let (j, choice) = match self.current {
            Some(c) => c,
            None if self.closed => return None,
            None if self.head_joins() => {
                let job = self.queue.pop_front().expect("the head joins");
                self.running.push(Some(Running { gens: (0..job.n).map(|_| None).collect(), job }));
                (self.running.len() - 1, 0)
            }
            None => {
                self.closed = !self.queue.is_empty();
                return None;
            }
        };
        let job = &self.running[j].as_ref().expect("a job being fed is not answered").job;
        self.current = (choice + 1 < job.n).then_some((j, choice + 1));
        self.rows.push((j, choice));
        // `ignore_eos`: the tokenizer's end-of-sequence ids are left out of the row's stop ids.
        let eos_of = (!job.output.ignore_eos).then_some(&self.state.tok);
        let stops = StopRules::new(eos_of, &job.sampling.stop_strings, &job.sampling.stop_token_ids);
        let sampling = Some(job.sampling.clone());
        Some(FedRow { prompt: job.prompt.clone(), seed: job.seed.wrapping_add(choice as u64), limit: job.sampling.max_new_tokens, stops: Some(stops), sampling })
    }

    fn between_reads(&mut self) {
        self.take_arrivals();
    }

    fn progressed(&mut self, id: usize, tokens: &[i64]) -> bool {
        let (j, choice) = self.rows[id];
        let r = self.running[j].as_mut().expect("a decoding row's job is not answered");
        self.state.progressed(&mut r.job, choice, tokens)
    }

    fn finished(&mut self, id: usize, g: Generation) {
        let (j, choice) = self.rows[id];
        let r = self.running[j].as_mut().expect("a job is answered after its last row");
        self.state.stream_end(&mut r.job, choice, &g);
        r.gens[choice] = Some(g);
        if r.gens.iter().all(Option::is_some) {
            let r = self.running[j].take().expect("running");
            let gens = r.gens.into_iter().map(|g| g.expect("every choice ended")).collect();
            self.state.answer(r.job, gens);
        }
    }
}

/// Drops the waiting jobs whose client has gone (a timed-out or stopped request is not decoded).
fn drop_gone(queue: &mut VecDeque<Job>) {
    let before = queue.len();
    queue.retain(|j| !j.client_gone());
    if queue.len() < before {
        tracing::info!("{} waiting request(s) dropped: the client went away", before - queue.len());
    }
}

/// Runs one session from the head of `queue` until no row decodes and no waiting job can join.
/// If generation fails, every job of the session not yet answered gets HTTP 500.
pub(super) fn run(state: &State, front: &Front, queue: &mut VecDeque<Job>) {
    drop_gone(queue);
    let Some(head) = queue.front() else { return };
    let sampling = head.sampling.clone();
    let context = state.context;
    // Each job's max_new_tokens was clamped to the context its prompt leaves, so the head fits.
    let fits = queue
        .iter()
        .take_while(|j| state.joins(&j.sampling, &sampling))
        .map(|j| j.prompt.len().next_multiple_of(PROMPT_ROUNDING) + j.sampling.max_new_tokens.next_multiple_of(BUDGET_ROUNDING))
        .max()
        .unwrap_or(0)
        .min(context);
    let slots = state.max_batch.max(1);
    let mut feed = Feed { state, front, queue, sampling: &sampling, fits, running: vec![], rows: vec![], current: None, closed: false };
    // libtorch reports some failures by panicking: a request must not take the server down.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tch::no_grad(|| model::generate_fed(state.model(), Some(&state.tok), &sampling, slots, fits, &mut feed))
    }));
    let msg = match result {
        Ok(Ok(())) => return,
        Ok(Err(e)) => format!("generation failed: {e}"),
        Err(p) => format!("generation panicked: {}", p.downcast_ref::<String>().cloned().unwrap_or_default()),
    };
    let taken: Vec<Job> = feed.running.into_iter().flatten().map(|r| r.job).collect();
    if taken.is_empty() {
        // It failed before taking a row (its params): the head would fail again.
        if let Some(job) = feed.queue.pop_front() {
            fail(job, &msg);
        }
    }
    for job in taken {
        fail(job, &msg);
    }
}
