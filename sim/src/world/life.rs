//! A request's own record as the world sees it: where it is in its life (`Life`) and what it
//! has cost so far (`Cost`). Each changes only through the named transitions here, which assert
//! the order the world relies on; the handlers read the fields through getters.

use cancelsim_models::sparse::Sparse;

/// Where a request is in its life, as the world sees it. Its times are boxed at the first:
/// a waiting request holds its flags and the pointer (24 bytes instead of 72).
#[derive(Clone, Debug, Default)]
pub(crate) struct Life {
    enqueued: bool,
    started: bool,
    /// Its blocks are back in the pool.
    engine_released: bool,
    /// It left its replica: no step in flight holds it, so its tag may be reused.
    engine_retired: bool,
    rejected: bool,
    /// Mirror of the controller's state being terminal, so a token need not look it up.
    terminal: bool,
    /// Its conversation turn has counted it as ended.
    turn_over: bool,
    /// Between a prefill and a decode stage: it may not leave yet.
    in_handoff: bool,
    /// The replica's intent epoch when the request reached it.
    epoch_at_enqueue: u64,
    times: Sparse<Times>,
}

#[derive(Clone, Debug, Default)]
struct Times {
    /// When a replica first put it in a step (its scheduling delay ends).
    started_ns: u64,
    /// Preemptions with recompute, summed over the replicas it went through.
    restarts: u32,
    first_token_ns: u64,
    last_token_ns: u64,
    tokens: u32,
    /// When the engine returned the request's blocks (whether or not it had an intent).
    released_ns: Option<u64>,
}

/// What a request's times read before its first.
static TIMES_NONE: Times = Times {
    started_ns: 0,
    restarts: 0,
    first_token_ns: 0,
    last_token_ns: 0,
    tokens: 0,
    released_ns: None,
};

impl Life {
    fn times(&self) -> &Times {
        self.times.get(&TIMES_NONE)
    }

    #[inline(always)]
    fn times_mut(&mut self) -> &mut Times {
        self.times.get_mut()
    }

    /// It left the world: its flags stay for a stale event to read, its times go with it.
    pub fn forget_times(&mut self) {
        self.times.clear();
    }

    /// Into a replica's waiting queue (once: the decode stage of a P/D graph is `decode_enqueue`).
    pub fn enqueue(&mut self, epoch: u64) {
        assert!(!self.enqueued, "a request was enqueued twice");
        assert!(!self.rejected, "a rejected request was enqueued");
        self.enqueued = true;
        self.epoch_at_enqueue = epoch;
    }

    /// Refused at arrival: it never holds blocks, and no replica will retire it.
    pub fn reject(&mut self) {
        assert!(!self.enqueued, "an enqueued request was rejected");
        self.rejected = true;
        self.engine_released = true;
        self.engine_retired = true;
    }

    /// A replica put it in a step at `now_ns`. True the first time (its scheduling delay ends).
    pub fn start(&mut self, now_ns: u64) -> bool {
        assert!(self.enqueued, "a request started before it was enqueued");
        if std::mem::replace(&mut self.started, true) {
            return false;
        }
        self.times_mut().started_ns = now_ns;
        true
    }

    /// The controller made it terminal (any number of times: the first transition wins there).
    pub fn terminate(&mut self) {
        self.terminal = true;
    }

    /// Its replica returned its blocks at `now_ns`, after `restarts` recomputes there.
    pub fn release(&mut self, restarts: u32, now_ns: u64) {
        assert!(
            self.enqueued,
            "a request was released that never reached a replica"
        );
        assert!(
            !self.engine_released,
            "a request's blocks were released twice"
        );
        self.engine_released = true;
        let t = self.times_mut();
        t.restarts += restarts;
        t.released_ns = Some(now_ns);
    }

    /// No step in flight holds it any more.
    pub fn retire(&mut self) {
        assert!(
            self.enqueued,
            "a request retired that never reached a replica"
        );
        self.engine_retired = true;
    }

    /// Output token `index` (from 1) came out at `now_ns`.
    pub fn token(&mut self, index: u32, now_ns: u64) {
        let t = self.times_mut();
        assert_eq!(index, t.tokens + 1, "output tokens out of order");
        t.tokens = index;
        if index == 1 {
            t.first_token_ns = now_ns;
        }
    }

    /// Output tokens up to `index` came out, none its first (whose time is kept).
    pub fn tokens_to(&mut self, index: u32) {
        let t = self.times_mut();
        assert!(
            t.tokens >= 1 && index > t.tokens,
            "output tokens out of order"
        );
        t.tokens = index;
    }

    /// Its last output token came out at `now_ns`.
    pub fn last_token(&mut self, now_ns: u64) {
        let t = self.times_mut();
        assert!(t.tokens > 0, "a last token before the first");
        t.last_token_ns = now_ns;
    }

    /// Its conversation turn counts it as ended. True the first time.
    pub fn end_turn(&mut self) -> bool {
        !std::mem::replace(&mut self.turn_over, true)
    }

    /// Prefilled: between the stages until `leave_handoff`.
    pub fn enter_handoff(&mut self) {
        assert!(!self.in_handoff, "a request entered the handoff twice");
        self.in_handoff = true;
    }

    pub fn leave_handoff(&mut self) {
        assert!(self.in_handoff, "a request left a handoff it was not in");
        self.in_handoff = false;
    }

    /// Across the link into the decode stage's queue: a new replica holds it from now.
    pub fn decode_enqueue(&mut self, epoch: u64) {
        assert!(
            self.enqueued,
            "a decode stage took a request no prefill stage had"
        );
        assert!(
            self.engine_released,
            "a decode stage took blocks the prefill stage holds"
        );
        self.leave_handoff();
        self.engine_released = false;
        self.engine_retired = false;
        self.epoch_at_enqueue = epoch;
    }

    pub fn enqueued(&self) -> bool {
        self.enqueued
    }
    pub fn started(&self) -> bool {
        self.started
    }
    pub fn started_ns(&self) -> u64 {
        self.times().started_ns
    }
    pub fn restarts(&self) -> u32 {
        self.times().restarts
    }
    pub fn engine_released(&self) -> bool {
        self.engine_released
    }
    pub fn engine_retired(&self) -> bool {
        self.engine_retired
    }
    pub fn rejected(&self) -> bool {
        self.rejected
    }
    pub fn terminal(&self) -> bool {
        self.terminal
    }
    pub fn first_token_ns(&self) -> u64 {
        self.times().first_token_ns
    }
    pub fn last_token_ns(&self) -> u64 {
        self.times().last_token_ns
    }
    pub fn tokens(&self) -> u32 {
        self.times().tokens
    }
    pub fn released_ns(&self) -> Option<u64> {
        self.times().released_ns
    }
    pub fn epoch_at_enqueue(&self) -> u64 {
        self.epoch_at_enqueue
    }
    pub fn in_handoff(&self) -> bool {
        self.in_handoff
    }
}

/// What one request cost, as its steps and releases come in. Times are GPU ns. Nothing until it
/// first costs something, so a waiting request holds only the pointer (8 bytes instead of 64).
#[derive(Clone, Debug, Default)]
pub(crate) struct Cost(Sparse<CostState>);

#[derive(Clone, Debug, Default)]
struct CostState {
    /// GPU time shared to its own tokens (each step's time split by tokens).
    gpu_ns: f64,
    /// GPU time after its intent, before and after the backend observed the cancel.
    leak_pre_ns: f64,
    leak_post_ns: f64,
    /// Tokens produced after its terminal transition (all discarded).
    late_tokens: u32,
    /// Of those, the ones the replica threw away itself (never among the tokens it received).
    late_discards: u32,
    /// Tokens it had in steps (prefill chunks and decode slots, discarded ones too).
    token_steps: u64,
    kv_block_ns: u128,
}

/// What a request's costs read before its first.
static COST_NONE: CostState = CostState {
    gpu_ns: 0.0,
    leak_pre_ns: 0.0,
    leak_post_ns: 0.0,
    late_tokens: 0,
    late_discards: 0,
    token_steps: 0,
    kv_block_ns: 0,
};

impl Cost {
    fn get(&self) -> &CostState {
        self.0.get(&COST_NONE)
    }

    #[inline(always)]
    fn get_mut(&mut self) -> &mut CostState {
        self.0.get_mut()
    }

    /// `tokens` of its tokens were in a step, and `own_ns` of the step's time went to its own
    /// output (0 for a discarded or padding slot): both in one reach of its costs, as this runs
    /// for every token of every step.
    #[inline(always)]
    pub fn stepped(&mut self, tokens: u32, own_ns: f64) {
        assert!(own_ns >= 0.0, "a negative GPU share: {own_ns}");
        let c = self.get_mut();
        c.token_steps += tokens as u64;
        c.gpu_ns += own_ns;
    }

    /// One token in each of several steps, its share of each in `own_ns`, in order: `stepped`
    /// for each. The shares were checked not negative as they were kept (`Lazy::record`).
    pub fn stepped_each(&mut self, own_ns: [&[f64]; 2]) {
        let c = self.get_mut();
        let mut gpu_ns = c.gpu_ns;
        for part in own_ns {
            c.token_steps += part.len() as u64;
            for &ns in part {
                debug_assert!(ns >= 0.0, "a negative GPU share: {ns}");
                gpu_ns += ns;
            }
        }
        c.gpu_ns = gpu_ns;
    }

    /// GPU work after its intent, before or after the backend observed the cancel.
    pub fn leak(&mut self, ns: f64, observed: bool) {
        assert!(ns >= 0.0, "a negative leak: {ns}");
        let c = self.get_mut();
        match observed {
            false => c.leak_pre_ns += ns,
            true => c.leak_post_ns += ns,
        }
    }

    /// A token came out after its terminal transition.
    pub fn late_token(&mut self) {
        self.get_mut().late_tokens += 1;
    }

    /// Its blocks came back, having been held for `block_ns` block-ns.
    pub fn released(&mut self, block_ns: u128) {
        // A request that never held a block (refused, or cancelled while waiting) costs nothing.
        if block_ns > 0 {
            self.get_mut().kv_block_ns += block_ns;
        }
    }

    pub fn gpu_ns(&self) -> f64 {
        self.get().gpu_ns
    }
    pub fn leak_pre_ns(&self) -> f64 {
        self.get().leak_pre_ns
    }
    pub fn leak_post_ns(&self) -> f64 {
        self.get().leak_post_ns
    }
    pub fn late_tokens(&self) -> u32 {
        self.get().late_tokens
    }
    pub fn late_discards(&self) -> u32 {
        self.get().late_discards
    }

    /// A late token the replica discarded itself (it is not among the tokens received).
    pub fn late_discard(&mut self) {
        self.get_mut().late_discards += 1;
    }
    pub fn token_steps(&self) -> u64 {
        self.get().token_steps
    }
    pub fn kv_block_ns(&self) -> u128 {
        self.get().kv_block_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enqueued() -> Life {
        let mut l = Life::default();
        l.enqueue(3);
        l
    }

    #[test]
    fn a_life_in_order_passes_every_assertion() {
        let mut l = enqueued();
        assert!(l.start(10));
        assert!(!l.start(20), "started once");
        l.token(1, 30);
        l.token(2, 40);
        l.last_token(40);
        l.release(1, 50);
        l.retire();
        assert_eq!(
            (l.first_token_ns(), l.last_token_ns(), l.tokens()),
            (30, 40, 2)
        );
        assert_eq!((l.released_ns(), l.restarts()), (Some(50), 1));
        assert!(l.end_turn() && !l.end_turn());
    }

    #[test]
    #[should_panic(expected = "enqueued twice")]
    fn enqueued_twice() {
        enqueued().enqueue(4);
    }

    #[test]
    #[should_panic(expected = "rejected request was enqueued")]
    fn enqueued_after_rejection() {
        let mut l = Life::default();
        l.reject();
        l.enqueue(0);
    }

    #[test]
    #[should_panic(expected = "enqueued request was rejected")]
    fn rejected_after_enqueue() {
        enqueued().reject();
    }

    #[test]
    #[should_panic(expected = "started before it was enqueued")]
    fn started_before_enqueue() {
        Life::default().start(1);
    }

    #[test]
    #[should_panic(expected = "never reached a replica")]
    fn released_before_enqueue() {
        Life::default().release(0, 1);
    }

    #[test]
    #[should_panic(expected = "released twice")]
    fn released_twice() {
        let mut l = enqueued();
        l.release(0, 1);
        l.release(0, 2);
    }

    #[test]
    #[should_panic(expected = "retired that never reached a replica")]
    fn retired_before_enqueue() {
        Life::default().retire();
    }

    #[test]
    #[should_panic(expected = "out of order")]
    fn a_token_skipped() {
        let mut l = enqueued();
        l.token(1, 1);
        l.token(3, 2);
    }

    #[test]
    #[should_panic(expected = "last token before the first")]
    fn a_last_token_first() {
        enqueued().last_token(1);
    }

    #[test]
    #[should_panic(expected = "entered the handoff twice")]
    fn into_the_handoff_twice() {
        let mut l = enqueued();
        l.enter_handoff();
        l.enter_handoff();
    }

    #[test]
    #[should_panic(expected = "left a handoff it was not in")]
    fn out_of_a_handoff_it_was_not_in() {
        enqueued().leave_handoff();
    }

    #[test]
    #[should_panic(expected = "blocks the prefill stage holds")]
    fn decoded_before_the_prefill_released() {
        let mut l = enqueued();
        l.enter_handoff();
        l.decode_enqueue(1);
    }

    #[test]
    #[should_panic(expected = "no prefill stage had")]
    fn decoded_without_a_prefill() {
        Life::default().decode_enqueue(1);
    }

    #[test]
    fn the_decode_stage_holds_it_again() {
        let mut l = enqueued();
        l.enter_handoff();
        l.release(0, 5);
        l.retire();
        l.decode_enqueue(7);
        assert!(!l.in_handoff() && !l.engine_released() && !l.engine_retired());
        assert_eq!(l.epoch_at_enqueue(), 7);
        l.release(0, 9);
    }

    #[test]
    #[should_panic(expected = "negative GPU share")]
    fn a_negative_share() {
        Cost::default().stepped(1, -1.0);
    }

    #[test]
    #[should_panic(expected = "negative leak")]
    fn a_negative_leak() {
        Cost::default().leak(-1.0, false);
    }
}
