//! Semantic validation of a parsed scenario, one function per section. Each returns the first
//! problem as the field's path and a message; nothing here panics on user input.

use super::{
    CheckpointConfig, IdentityMode, Policy, ProfileRef, Router, Scenario, Scheduler, Source,
    StepForm, SwarmRanges, Workload, REPLICAS_MAX, REQUESTS_MAX,
};
use crate::coverage::Mark;
use crate::dist::Dist;

/// A semantic problem with a scenario: the field's dotted path and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub field: String,
    pub message: String,
}

pub(super) type Check = Result<(), Invalid>;

pub(super) fn err(field: &str, message: String) -> Check {
    Err(Invalid {
        field: field.to_string(),
        message,
    })
}

pub(super) fn positive(field: &str, x: f64) -> Check {
    if !x.is_finite() || x <= 0.0 {
        return err(field, format!("must be a finite number > 0 (got {x})"));
    }
    Ok(())
}

pub(super) fn non_negative(field: &str, x: f64) -> Check {
    if !x.is_finite() || x < 0.0 {
        return err(field, format!("must be a finite number >= 0 (got {x})"));
    }
    Ok(())
}

pub(super) fn probability(field: &str, p: f64) -> Check {
    if !(0.0..=1.0).contains(&p) {
        return err(field, format!("must be a probability in [0, 1] (got {p})"));
    }
    Ok(())
}

pub(super) fn in_range(field: &str, x: u64, lo: u64, hi: u64) -> Check {
    if x < lo || x > hi {
        return err(field, format!("must be between {lo} and {hi} (got {x})"));
    }
    Ok(())
}

pub(super) fn count(field: &str, n: u64) -> Check {
    in_range(field, n, 1, REQUESTS_MAX)
}

pub(super) fn dist(field: &str, d: &Dist) -> Check {
    d.validate().map_err(|e| Invalid {
        field: format!("{field}.{}", e.field),
        message: e.message,
    })
}

/// A swarm range `(low, high)` with `0 <= low <= high`, both finite.
fn ordered(field: &str, lo: f64, hi: f64) -> Check {
    if !(lo.is_finite() && hi.is_finite() && lo <= hi && lo >= 0.0) {
        let m = format!("must be a range (low, high) with 0 <= low <= high (got ({lo}, {hi}))");
        return err(field, m);
    }
    Ok(())
}

impl Scenario {
    /// Semantic validation: the first problem found, section by section.
    pub fn validate(&self) -> Result<(), Invalid> {
        self.validate_name_and_limits()?;
        validate_source(&self.workload.source)?;
        validate_lengths(&self.workload)?;
        self.validate_cluster()?;
        self.validate_cancellation()?;
        self.validate_checks()?;
        if let Some(r) = &self.swarm {
            validate_swarm(r)?;
            let graph = r.prefill_replicas.is_some()
                || r.decode_replicas.is_some()
                || r.link_loss.is_some();
            if graph && self.prefill_decode().is_none() {
                let m = "prefill_replicas, decode_replicas and link_loss need a prefill/decode \
                         graph (`cluster.topology`)";
                return err("swarm", m.into());
            }
        }
        let pb = &self.playback;
        in_range("playback.chunk_tokens", pb.chunk_tokens as u64, 1, 1 << 20)?;
        dist("playback.writer_wait_ms", &pb.writer_wait_ms)?;
        dist("playback.clear_ack_ms", &pb.clear_ack_ms)?;
        non_negative("playback.max_age_ms", pb.max_age_ms)?;
        in_range("playback.admit_retries", pb.admit_retries as u64, 0, 1000)
    }

    fn validate_name_and_limits(&self) -> Check {
        let name_ok = !self.name.is_empty()
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !name_ok {
            let m = "must be non-empty and use only letters, digits, '-' and '_'";
            return err("name", format!("{m} (got {:?})", self.name));
        }
        let l = &self.limits;
        if l.max_events == 0 {
            return err("limits.max_events", "must be > 0".into());
        }
        if l.max_queue_len == 0 {
            return err("limits.max_queue_len", "must be > 0".into());
        }
        if !(1..=REQUESTS_MAX).contains(&l.max_in_system) {
            let m = format!("must be 1 to {REQUESTS_MAX} (got {})", l.max_in_system);
            return err("limits.max_in_system", m);
        }
        positive("limits.max_time_s", l.max_time_s)?;
        if l.max_time_s > 1e9 {
            let m = format!("must be <= 1e9 s (got {})", l.max_time_s);
            return err("limits.max_time_s", m);
        }
        Ok(())
    }

    fn validate_cluster(&self) -> Check {
        let c = &self.cluster;
        if let Some(t) = &c.topology {
            // Each stage's count is named by its stage (1 to REPLICAS_MAX), before their sum.
            t.build()?;
            use super::RoleSpec::{Colocated, Decode, Prefill};
            let serving =
                (t.stages.iter()).filter(|s| matches!(s.role, Colocated | Prefill | Decode));
            let total: u64 = serving.map(|s| s.replicas as u64).sum();
            if total > REPLICAS_MAX as u64 {
                let m = format!(
                    "must be at most {REPLICAS_MAX} replicas in all (the serving stages have \
                     {total})"
                );
                return err("cluster.topology.stages", m);
            }
        }
        if c.replicas == 0 || c.replicas > REPLICAS_MAX {
            let m = format!("must be between 1 and {REPLICAS_MAX} (got {})", c.replicas);
            return err("cluster.replicas", m);
        }
        if let Router::SharedQueue { max_outstanding } = c.router {
            if max_outstanding == 0 || max_outstanding > 1 << 20 {
                let m = format!("must be between 1 and 2^20 (got {max_outstanding})");
                return err("cluster.router.SharedQueue.max_outstanding", m);
            }
        }
        self.validate_kv_router()?;
        validate_serving(c)?;
        self.validate_topology()
    }
}

/// A cluster's (or a stage's) profile, step model, scheduler and memory.
pub(super) fn validate_serving(c: &super::Cluster) -> Check {
    validate_profile(&c.profile)?;
    validate_step_model(&c.profile, c.step_model)?;
    validate_shares(c)?;
    validate_scheduler(&c.scheduler)?;
    validate_memory(c)
}

/// The share of device memory is a fraction, and on a named profile leaves room for a KV
/// cache once the weights and the activations are in.
fn validate_memory(c: &super::Cluster) -> Check {
    let f = "cluster.gpu_memory_utilization";
    let u = c.gpu_memory_utilization;
    if !(u.is_finite() && u > 0.0 && u <= 1.0) {
        return err(f, format!("must be in (0, 1] (got {u})"));
    }
    let Some(p) = c.profile.named() else {
        return Ok(());
    };
    let batched = match &c.scheduler {
        Scheduler::Continuous {
            max_num_batched_tokens: Some(n),
            ..
        } => *n,
        _ => p.max_num_batched_tokens,
    };
    let plan = p.plan((u * 1e6).round() as u64, batched as u64);
    if plan.kv_tokens < 16 {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let m = format!(
            "leaves no memory for the KV cache on {}: {:.2} GiB usable per GPU, {:.2} GiB of \
                 weights, {:.2} GiB of activations and runtime",
            p.name,
            gib(plan.usable_bytes),
            gib(plan.weight_bytes),
            gib(plan.non_torch_bytes + plan.activation_bytes)
        );
        return err(f, m);
    }
    Ok(())
}

impl Scenario {
    fn validate_cancellation(&self) -> Check {
        if let Some(c) = &self.cancellation {
            c.validate_aiperf()?;
            probability("cancellation.fraction", c.fraction)?;
            dist("cancellation.delay_ms", &c.delay_ms)?;
            if let Some((from, to)) = c.window_s {
                let ok = from.is_finite() && to.is_finite() && 0.0 <= from && from < to;
                if !ok {
                    let m = format!("must be (from, to) with 0 <= from < to (got ({from}, {to}))");
                    return err("cancellation.window_s", m);
                }
            }
        }
        let n = self.policies.len();
        if n == 0 {
            return err("policies", "needs at least one policy".into());
        }
        if n > 16 {
            return err("policies", format!("at most 16 policies (got {n})"));
        }
        for (i, p) in self.policies.iter().enumerate() {
            if let Policy::PerRequestWithFallback { fallback_after_ms } = p {
                let f = format!("policies[{i}].PerRequestWithFallback.fallback_after_ms");
                non_negative(&f, *fallback_after_ms)?;
            }
        }
        let a = &self.adapter;
        dist("adapter.submit_delay_ms", &a.submit_delay_ms)?;
        dist("adapter.rpc_latency_ms", &a.rpc_latency_ms)?;
        probability("adapter.loss", a.loss)?;
        probability("adapter.duplicate", a.duplicate)?;
        positive("adapter.timeout_ms", a.timeout_ms)?;
        in_range("adapter.max_attempts", a.max_attempts as u64, 1, 100)?;
        if let IdentityMode::ClientReused { pool } = a.identity {
            in_range("adapter.identity.ClientReused.pool", pool, 1, u64::MAX)?;
        }
        let b = &self.backend;
        if let CheckpointConfig::EveryKSteps(k) = b.checkpoint {
            in_range("backend.checkpoint.EveryKSteps", k as u64, 1, 1_000_000)?;
        }
        probability("backend.abort_fault_probability", b.abort_fault_probability)?;
        non_negative("backend.clock_offset_ms", b.clock_offset_ms)
    }

    /// Expectations and properties name policies of this scenario; coverage marks exist.
    fn validate_checks(&self) -> Check {
        let labels: Vec<String> = self.policies.iter().map(Policy::label).collect();
        for (i, e) in self.expect.iter().enumerate() {
            if e.policy != "*" && !labels.contains(&e.policy) {
                let m = format!(
                    "names no policy of this scenario (got {:?}; have {})",
                    e.policy,
                    labels.join(", ")
                );
                return err(&format!("expect[{i}].policy"), m);
            }
        }
        for (i, l) in self.properties.sibling_isolation.iter().enumerate() {
            if !labels.contains(l) {
                let m = format!("names no policy of this scenario (got {l:?})");
                return err(&format!("properties.sibling_isolation[{i}]"), m);
            }
        }
        for (i, m) in self.coverage.iter().enumerate() {
            if Mark::parse(m).is_none() {
                let known: Vec<&str> = Mark::ALL.iter().map(|m| m.as_str()).collect();
                let msg = format!("unknown mark {m:?}; known: {}", known.join(", "));
                return err(&format!("coverage[{i}]"), msg);
            }
        }
        Ok(())
    }
}

fn validate_source(source: &Source) -> Check {
    match source {
        Source::Poisson {
            rate_per_s,
            requests,
        } => {
            positive("workload.source.Poisson.rate_per_s", *rate_per_s)?;
            count("workload.source.Poisson.requests", *requests)
        }
        Source::Gamma {
            rate_per_s,
            cv,
            requests,
        } => {
            positive("workload.source.Gamma.rate_per_s", *rate_per_s)?;
            non_negative("workload.source.Gamma.cv", *cv)?;
            if *cv > crate::dist::GAMMA_CV_MAX {
                return err(
                    "workload.source.Gamma.cv",
                    format!("must be <= 10 (got {cv})"),
                );
            }
            count("workload.source.Gamma.requests", *requests)
        }
        Source::OnOff {
            rate_on_per_s: on,
            rate_off_per_s: off,
            on_ms,
            off_ms,
            requests: n,
        } => {
            let f = "workload.source.OnOff";
            positive(&format!("{f}.rate_on_per_s"), *on)?;
            non_negative(&format!("{f}.rate_off_per_s"), *off)?;
            dist(&format!("{f}.on_ms"), on_ms)?;
            dist(&format!("{f}.off_ms"), off_ms)?;
            if on_ms.mean() <= 0.0 {
                return err(&format!("{f}.on_ms"), "must have a mean > 0".into());
            }
            count(&format!("{f}.requests"), *n)
        }
        Source::Conversations { .. } => validate_conversations(source),
        Source::Jobs { .. } => validate_jobs(source),
        Source::AgentTrace { .. } => validate_jobs(source),
        Source::Trace {
            path,
            speedup,
            sample_fraction,
            max_total_tokens,
            ..
        } => {
            let f = "workload.source.Trace";
            if max_total_tokens.is_some_and(|m| m < 2) {
                let m = "must be at least 2 (one prompt and one output token)".into();
                return err(&format!("{f}.max_total_tokens"), m);
            }
            if path.is_empty() {
                return err(&format!("{f}.path"), "must not be empty".into());
            }
            positive(&format!("{f}.speedup"), *speedup)?;
            probability(&format!("{f}.sample_fraction"), *sample_fraction)?;
            if *sample_fraction == 0.0 {
                return err(&format!("{f}.sample_fraction"), "must be > 0".into());
            }
            Ok(())
        }
    }
}

fn validate_jobs(source: &Source) -> Check {
    if let Source::AgentTrace { path, job } = source {
        if path.is_empty() {
            return err("workload.source.AgentTrace.path", "must name a file".into());
        }
        return job.validate_traced("workload.source.AgentTrace.job");
    }
    let Source::Jobs {
        jobs,
        rate_per_s,
        job,
    } = source
    else {
        return Ok(());
    };
    let f = "workload.source.Jobs";
    count(&format!("{f}.jobs"), *jobs)?;
    positive(&format!("{f}.rate_per_s"), *rate_per_s)?;
    job.validate(&format!("{f}.job"))
}

fn validate_conversations(source: &Source) -> Check {
    let Source::Conversations {
        conversations,
        start_rate_per_s,
        turns,
        think_ms,
        requests_per_turn,
        barge_in,
        history: _,
    } = source
    else {
        return Ok(());
    };
    let f = "workload.source.Conversations";
    count(&format!("{f}.conversations"), *conversations)?;
    positive(&format!("{f}.start_rate_per_s"), *start_rate_per_s)?;
    dist(&format!("{f}.turns"), turns)?;
    dist(&format!("{f}.think_ms"), think_ms)?;
    if *requests_per_turn == 0 || *requests_per_turn > 64 {
        let m = format!("must be between 1 and 64 (got {requests_per_turn})");
        return err(&format!("{f}.requests_per_turn"), m);
    }
    if let Some(b) = barge_in {
        probability(&format!("{f}.barge_in.probability"), b.probability)?;
        dist(&format!("{f}.barge_in.after_ms"), &b.after_ms)?;
    }
    Ok(())
}

fn validate_lengths(w: &Workload) -> Check {
    dist("workload.prompt_tokens", &w.prompt_tokens)?;
    dist("workload.output_tokens", &w.output_tokens)?;
    if let Some(d) = &w.deadline_ms {
        dist("workload.deadline_ms", d)?;
    }
    if let Some(d) = &w.disconnect_ms {
        dist("workload.disconnect_ms", d)?;
    }
    if let Some(st) = &w.stop_strings {
        probability("workload.stop_strings.probability", st.probability)?;
        dist("workload.stop_strings.detect_ms", &st.detect_ms)?;
    }
    probability("workload.length_capped", w.length_capped)
}

/// `Linear` needs a named profile with 0.1 constants; `Roofline` needs a named profile (a `Custom`
/// one is the linear form).
fn validate_step_model(p: &ProfileRef, form: Option<StepForm>) -> Check {
    match (p, form) {
        (ProfileRef::Named(name), Some(StepForm::Linear)) => {
            let linear = cancelsim_models::gpu::profile(name).and_then(|p| p.linear_v1);
            if linear.is_none() {
                let m = format!("profile {name:?} has no linear constants; use Roofline");
                return err("cluster.step_model", m);
            }
            Ok(())
        }
        (ProfileRef::Custom { .. }, Some(StepForm::Roofline)) => err(
            "cluster.step_model",
            "a Custom profile gives linear step costs; Roofline needs a named profile".into(),
        ),
        (ProfileRef::Table { .. }, Some(_)) => err(
            "cluster.step_model",
            "a Table profile's step times are the table's; leave step_model out".into(),
        ),
        _ => Ok(()),
    }
}

/// Roofline shares are whole percentages of a named profile's roofline.
fn validate_shares(c: &super::Cluster) -> Check {
    let Some(shares) = c.roofline else {
        return Ok(());
    };
    if !c.is_named_roofline() {
        let m =
            "sets a roofline's utilisations: it needs a named profile on the Roofline step model";
        return err("cluster.roofline", m.into());
    }
    match shares.shares().out_of_range() {
        Some((name, pct)) => err(
            &format!("cluster.roofline.{name}"),
            format!("must be a whole percentage from 1 to 100 (got {pct})"),
        ),
        None => Ok(()),
    }
}

fn validate_profile(p: &ProfileRef) -> Check {
    if let ProfileRef::Named(name) = p {
        if cancelsim_models::gpu::profile(name).is_none() {
            let m = cancelsim_models::gpu::unknown_profile(name);
            return err("cluster.profile.Named", m);
        }
    }
    if let ProfileRef::Table { path, kv_blocks_16 } = p {
        if path.trim().is_empty() {
            return err("cluster.profile.Table.path", "must name a CSV file".into());
        }
        if *kv_blocks_16 == 0 {
            return err("cluster.profile.Table.kv_blocks_16", "must be > 0".into());
        }
        return Ok(());
    }
    let Some(c) = p.custom() else {
        return Ok(());
    };
    let f = "cluster.profile.Custom";
    positive(&format!("{f}.c0_ms"), c.c0_ms)?;
    non_negative(&format!("{f}.prefill_tokens_per_s"), c.prefill_tokens_per_s)?;
    // Kept in whole tokens per second: a rate below one would round to 0, which means free.
    if c.prefill_tokens_per_s > 0.0 && c.prefill_tokens_per_s < 1.0 {
        let m = format!(
            "must be 0 (prefill costs nothing) or at least 1 token/s (got {})",
            c.prefill_tokens_per_s
        );
        return err(&format!("{f}.prefill_tokens_per_s"), m);
    }
    non_negative(&format!("{f}.per_seq_us"), c.per_seq_us)?;
    non_negative(&format!("{f}.per_kv_token_ns"), c.per_kv_token_ns)?;
    if c.kv_blocks_16 == 0 {
        return err(&format!("{f}.kv_blocks_16"), "must be > 0".into());
    }
    Ok(())
}

fn validate_scheduler(s: &Scheduler) -> Check {
    match s {
        Scheduler::Continuous {
            max_num_seqs,
            max_num_batched_tokens,
            block_tokens,
            kv_blocks,
            window,
            watermark,
            ..
        } => {
            let f = "cluster.scheduler.Continuous";
            if !(0.0..0.5).contains(watermark) {
                let m = format!("must be at least 0 and below 0.5 (got {watermark})");
                return err(&format!("{f}.watermark"), m);
            }
            let seqs = max_num_seqs.unwrap_or(1) as u64;
            in_range(&format!("{f}.max_num_seqs"), seqs, 1, 1 << 20)?;
            let tokens = max_num_batched_tokens.unwrap_or(1) as u64;
            in_range(&format!("{f}.max_num_batched_tokens"), tokens, 1, 1 << 24)?;
            in_range(&format!("{f}.block_tokens"), *block_tokens as u64, 1, 4096)?;
            in_range(
                &format!("{f}.kv_blocks"),
                kv_blocks.unwrap_or(1),
                1,
                1 << 32,
            )?;
            in_range(&format!("{f}.window"), *window as u64, 1, 64)
        }
        Scheduler::Dynamic {
            max_batch_size,
            max_queue_delay_ms,
            block_tokens,
            kv_blocks,
        } => {
            let f = "cluster.scheduler.Dynamic";
            in_range(
                &format!("{f}.max_batch_size"),
                *max_batch_size as u64,
                1,
                1 << 16,
            )?;
            non_negative(&format!("{f}.max_queue_delay_ms"), *max_queue_delay_ms)?;
            in_range(&format!("{f}.block_tokens"), *block_tokens as u64, 1, 4096)?;
            in_range(
                &format!("{f}.kv_blocks"),
                kv_blocks.unwrap_or(1),
                1,
                1 << 32,
            )
        }
    }
}

fn validate_swarm(r: &SwarmRanges) -> Check {
    if let Some((a, b)) = r.requests {
        ordered("swarm.requests", a as f64, b as f64)?;
        in_range("swarm.requests", a, 1, REQUESTS_MAX)?;
    }
    if let Some((a, b)) = r.fraction {
        ordered("swarm.fraction", a, b)?;
        probability("swarm.fraction", b)?;
    }
    if let Some((a, b)) = r.window {
        ordered("swarm.window", a as f64, b as f64)?;
        in_range("swarm.window", a as u64, 1, 64)?;
    }
    if let Some((a, b)) = r.max_num_seqs {
        ordered("swarm.max_num_seqs", a as f64, b as f64)?;
        in_range("swarm.max_num_seqs", a as u64, 1, 1 << 20)?;
    }
    if let Some((a, b)) = r.loss {
        ordered("swarm.loss", a, b)?;
        probability("swarm.loss", b)?;
    }
    if let Some((a, b)) = r.writer_wait_ms {
        ordered("swarm.writer_wait_ms", a, b)?;
    }
    for (f, range) in [
        ("swarm.prefill_replicas", r.prefill_replicas),
        ("swarm.decode_replicas", r.decode_replicas),
    ] {
        if let Some((a, b)) = range {
            ordered(f, a as f64, b as f64)?;
            in_range(f, a as u64, 1, 512)?;
            in_range(f, b as u64, 1, 512)?;
        }
    }
    if let Some((a, b)) = r.link_loss {
        ordered("swarm.link_loss", a, b)?;
        probability("swarm.link_loss", b)?;
    }
    Ok(())
}
