//! A request's output digest: FNV-1a over the 16-byte markers of the chunks it played, in
//! order, what its user heard. It goes into each outcome and so into the answers' hash: its
//! definition never changes, only when it is computed.
//!
//! Why runs: FNV-1a is a chain of dependent multiplies, one a byte, 16 a chunk, and a lazy
//! request's chunks are played in runs (`PlaybackSink::play_run`), each chunk its own
//! uncorrupted marker, a function of the request and the chunk alone. So a digest owes such a
//! run instead of folding it (`Digest`), and the requests that leave hand what they owe to the
//! books, which fold several side by side before they hash the outcomes (`fold_runs`,
//! `Outcomes`): each chain stays serial, but the chains' multiplies overlap. A digest read
//! before then folds what it owes on the spot (`Digest::value`).

/// FNV-1a's offset basis: the digest of a request that played nothing.
const SEED: u64 = 0xcbf2_9ce4_8422_2325;

const PRIME: u64 = 0x0100_0000_01b3;

/// The synthetic payload marker of chunk `chunk` of request `id`: 16 bytes a consumer can check
/// byte for byte. A corrupted chunk (KV reused while still written) has its check word flipped.
pub(crate) fn marker(id: u64, chunk: u32, corrupted: bool) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&id.to_le_bytes());
    m[8..12].copy_from_slice(&chunk.to_le_bytes());
    let check = check_word(id, chunk);
    m[12..16].copy_from_slice(&(if corrupted { !check } else { check }).to_le_bytes());
    m
}

fn check_word(id: u64, chunk: u32) -> u32 {
    let x = (id ^ ((chunk as u64) << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 32) as u32
}

/// FNV-1a over bytes, folded into a running digest.
#[inline]
fn fold(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(PRIME);
    }
    h
}

/// The uncorrupted markers of chunks `from..from + n` of request `id`, folded in order, one
/// chain: what `fold_runs` computes for one run.
fn fold_markers(mut h: u64, id: u64, from: u32, n: u32) -> u64 {
    for chunk in from..from + n {
        h = fold(h, &marker(id, chunk, false));
    }
    h
}

/// A request's output digest: what it folded, then a run of uncorrupted chunks it played last
/// and still owes. One writer: the sink, through `play` and `owe`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Digest {
    folded: u64,
    owed_from: u32,
    owed: u32,
}

impl Digest {
    pub const NEW: Digest = Digest {
        folded: SEED,
        owed_from: 0,
        owed: 0,
    };

    /// Request `id` played the uncorrupted markers of chunks `from..from + n`: owed, after
    /// the run owed so far (folded first if `from` does not follow it).
    pub fn owe(&mut self, id: u64, from: u32, n: u32) {
        if self.owed > 0 && self.owed_from + self.owed != from {
            self.settle(id);
        }
        if self.owed == 0 {
            self.owed_from = from;
        }
        self.owed = (self.owed.checked_add(n)).expect("a run of at most u32::MAX chunks");
    }

    /// Request `id` played `payload` as chunk `chunk`: owed if a run is owed and it is the
    /// chunk's own uncorrupted marker (a lazy request's last chunk, after its run), else folded
    /// now, after what is owed. Why not owe every chunk: a chunk played alone comes with its
    /// own event, whose work its fold overlaps, while a long run owed would be folded in one
    /// chain where a digest is read early (`Baseline::left`).
    pub fn play(&mut self, id: u64, chunk: u32, payload: &[u8]) {
        if self.owed > 0 {
            if *payload == marker(id, chunk, false) {
                return self.owe(id, chunk, 1);
            }
            self.settle(id);
        }
        self.folded = fold(self.folded, payload);
    }

    fn settle(&mut self, id: u64) {
        self.folded = fold_markers(self.folded, id, self.owed_from, self.owed);
        self.owed = 0;
    }

    /// The digest of request `id`, its owed run folded on the spot.
    pub fn value(&self, id: u64) -> u64 {
        fold_markers(self.folded, id, self.owed_from, self.owed)
    }

    /// What is left to fold for request `id`, to fold beside others (`fold_runs`).
    pub fn run(&self, id: u64) -> Run {
        Run {
            h: self.folded,
            id,
            next: self.owed_from,
            end: self.owed_from + self.owed,
        }
    }
}

/// Runs folded side by side: four chains keep a core's multiplier busy (a 64-bit multiply
/// takes three cycles, and a core starts one a cycle).
const LANES: usize = 4;

/// A run to fold: the digest `h` so far, then the uncorrupted markers of request `id`'s
/// chunks `next..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub h: u64,
    pub id: u64,
    pub next: u32,
    pub end: u32,
}

impl Run {
    /// A digest with nothing left to fold.
    pub fn folded(h: u64) -> Run {
        Run {
            h,
            id: 0,
            next: 0,
            end: 0,
        }
    }

    fn left(&self) -> bool {
        self.next < self.end
    }
}

/// Every run folded into its `h` (`next` becomes `end`): the value `fold_markers` gives it
/// alone, with up to `LANES` runs' chains interleaved byte by byte. A lane whose run is done
/// takes the next run not yet begun; the last run left goes on alone.
fn fold_runs(runs: &mut [Run]) {
    // Runs before `begun` have had a lane, or had nothing to fold.
    let mut begun = 0;
    // The busy lanes are `lanes[..busy]`, each a run with chunks left.
    let (mut lanes, mut busy) = ([0usize; LANES], 0);
    loop {
        while busy < LANES && begun < runs.len() {
            if runs[begun].left() {
                (lanes[busy], busy) = (begun, busy + 1);
            }
            begun += 1;
        }
        match busy {
            0 => break,
            1 => {
                let r = &mut runs[lanes[0]];
                (r.h, r.next) = (fold_markers(r.h, r.id, r.next, r.end - r.next), r.end);
                break;
            }
            2 => fold_round::<2>(runs, &lanes),
            3 => fold_round::<3>(runs, &lanes),
            _ => fold_round::<LANES>(runs, &lanes),
        }
        let mut k = 0;
        while k < busy {
            if runs[lanes[k]].left() {
                k += 1;
            } else {
                busy -= 1;
                lanes[k] = lanes[busy];
            }
        }
    }
    debug_assert!(runs.iter().all(|r| !r.left()));
}

/// The next marker of each of the runs in the first `N` lanes folded into its `h`, the chains
/// side by side.
#[inline(always)]
fn fold_round<const N: usize>(runs: &mut [Run], lanes: &[usize; LANES]) {
    let at: [Run; N] = std::array::from_fn(|k| runs[lanes[k]]);
    let m: [[u8; 16]; N] = std::array::from_fn(|k| marker(at[k].id, at[k].next, false));
    let mut h: [u64; N] = std::array::from_fn(|k| at[k].h);
    // Bytes outside, lanes inside: each multiply waits on its own lane's last one only.
    for byte in 0..16 {
        for (h, m) in h.iter_mut().zip(&m) {
            *h = (*h ^ m[byte] as u64).wrapping_mul(PRIME);
        }
    }
    for k in 0..N {
        let r = &mut runs[lanes[k]];
        (r.h, r.next) = (h[k], r.next + 1);
    }
}

/// An outcome's bytes: id, state, output digest, tokens, chunks played.
pub(crate) const OUTCOME_LEN: usize = 25;
/// Where the output digest lies in an outcome.
const OUTCOME_DIGEST: std::ops::Range<usize> = 9..17;
/// Outcomes held for their digests to fold side by side: enough that the lanes seldom wait
/// for a run, and few enough (3 KB with their runs) to stay in the first-level cache.
const OUTCOMES_HELD: usize = 64;

/// Every request's outcome, hashed in the order requests left, each with its output digest
/// folded late: the last outcomes, at most `OUTCOMES_HELD`, are held with their runs, then
/// folded side by side (`fold_runs`) and hashed.
#[derive(Default)]
pub(crate) struct Outcomes {
    hasher: crate::kernel::BufferedHasher,
    held: Vec<[u8; OUTCOME_LEN]>,
    runs: Vec<Run>,
}

impl Outcomes {
    /// The next outcome, its digest's bytes still to come from `digest`.
    pub fn push(&mut self, outcome: [u8; OUTCOME_LEN], digest: Run) {
        assert!(
            self.held.len() < OUTCOMES_HELD,
            "outcomes held past the bound"
        );
        self.held.push(outcome);
        self.runs.push(digest);
        if self.held.len() == OUTCOMES_HELD {
            fold_held(&mut self.held, &mut self.runs);
            for outcome in &self.held {
                self.hasher.update(outcome);
            }
            self.held.clear();
            self.runs.clear();
        }
    }

    /// The hash of every outcome so far, those held included.
    pub fn hash(&self) -> blake3::Hash {
        let (mut held, mut runs) = (self.held.clone(), self.runs.clone());
        fold_held(&mut held, &mut runs);
        self.hasher.finalize_after(held.as_flattened())
    }
}

/// The held outcomes' digests folded and written in.
fn fold_held(held: &mut [[u8; OUTCOME_LEN]], runs: &mut [Run]) {
    assert_eq!(held.len(), runs.len(), "an outcome held without its run");
    fold_runs(runs);
    for (outcome, run) in held.iter_mut().zip(runs) {
        outcome[OUTCOME_DIGEST].copy_from_slice(&run.h.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_is_fnv_1a_64() {
        // The published FNV-1a 64-bit test vectors (Fowler, Noll and Vo).
        assert_eq!(fold(SEED, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fold(SEED, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fold(SEED, b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn markers_check_byte_for_byte_and_corruption_flips_only_the_check_word() {
        let (a, b) = (marker(7, 3, false), marker(7, 3, true));
        assert_eq!(a[..12], b[..12]);
        assert_ne!(a[12..], b[12..]);
        assert_ne!(marker(7, 3, false), marker(8, 3, false));
        assert_ne!(marker(7, 3, false), marker(7, 4, false));
    }

    /// A xorshift generator for the cases: the tests need no stream of the simulator's own.
    fn cases() -> impl FnMut() -> u64 {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    #[test]
    fn runs_folded_side_by_side_fold_what_each_folds_alone() {
        // From none to 13 runs (fewer, as many and more than the lanes) of every length from
        // none to 9, from chunks near 0 and near u32::MAX, with ids of every size: each run's
        // result is its own chain's, whatever the others hold.
        let mut next = cases();
        for case in 0..2000 {
            let runs: Vec<Run> = (0..next() % 14)
                .map(|_| {
                    let n = (next() % 10) as u32;
                    let from = if case % 3 == 0 {
                        u32::MAX - 9
                    } else {
                        (next() % 1000) as u32
                    };
                    let id = next() >> (next() % 64);
                    Run {
                        h: next(),
                        id,
                        next: from,
                        end: from + n,
                    }
                })
                .collect();
            let mut folded = runs.clone();
            fold_runs(&mut folded);
            for (r, f) in runs.iter().zip(&folded) {
                let alone = fold_markers(r.h, r.id, r.next, r.end - r.next);
                assert_eq!((f.h, f.next, f.id), (alone, r.end, r.id), "case {case}");
            }
        }
    }

    #[test]
    fn a_digest_that_owes_reads_as_one_folded_at_once() {
        // Plays and runs in any order (a corrupted or foreign payload, a gap where chunks
        // were suppressed): the value, and the value its run folds to, are those of folding
        // each payload as it comes.
        let mut next = cases();
        for case in 0..2000 {
            let id = next() % 50;
            let (mut d, mut eager, mut chunk) = (Digest::NEW, SEED, 0u32);
            for _ in 0..next() % 12 {
                chunk += (next() % 4 == 0) as u32; // a gap: a chunk suppressed
                match next() % 4 {
                    0 => {
                        let n = (next() % 5) as u32;
                        d.owe(id, chunk, n);
                        eager = fold_markers(eager, id, chunk, n);
                        chunk += n;
                    }
                    k => {
                        let payload = match k {
                            1 => marker(id, chunk, false),
                            2 => marker(id, chunk, true),
                            _ => marker(id + 1, chunk, false),
                        };
                        d.play(id, chunk, &payload);
                        eager = fold(eager, &payload);
                        chunk += 1;
                    }
                }
                assert_eq!(d.value(id), eager, "case {case}");
            }
            let mut run = [d.run(id)];
            fold_runs(&mut run);
            assert_eq!(run[0].h, eager, "case {case}");
        }
    }

    #[test]
    fn outcomes_hash_as_each_hashed_with_its_digest_as_it_came() {
        // Fewer, as many and more outcomes than are held, read before and after the held
        // ones are hashed: the hash is BLAKE3 over the outcomes in order, each with its
        // digest folded on the spot.
        let mut next = cases();
        let mut outcomes = Outcomes::default();
        let mut eager = Vec::new();
        for n in 0..3 * OUTCOMES_HELD + 5 {
            let id = next() % 1000;
            let run = match n % 3 {
                0 => Run::folded(next()),
                _ => Run {
                    h: next(),
                    id,
                    next: (next() % 100) as u32,
                    end: 100 + (next() % 40) as u32,
                },
            };
            let mut outcome = [0u8; OUTCOME_LEN];
            outcome.iter_mut().for_each(|b| *b = next() as u8);
            outcomes.push(outcome, run);
            let digest = fold_markers(run.h, run.id, run.next, run.end - run.next);
            outcome[OUTCOME_DIGEST].copy_from_slice(&digest.to_le_bytes());
            eager.extend_from_slice(&outcome);
            assert_eq!(outcomes.hash(), blake3::hash(&eager), "after {n}");
        }
    }
}
