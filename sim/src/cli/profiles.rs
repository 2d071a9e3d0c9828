//! `cancelsim profiles`: the named hardware profiles, their memory plan and a few step times, so
//! a planner sees what a name stands for before running it.

use cancelsim_models::gpu::{self, StepShape, PROFILES};

use super::{Fail, Outcome};

/// One line per profile: capacity from the memory planner at `utilization` of device memory
/// (with the profile's default batched-token budget), and roofline step times.
pub fn profiles(utilization: f64) -> Outcome {
    if !(utilization.is_finite() && utilization > 0.0 && utilization <= 1.0) {
        let m = format!("--gpu-memory-utilization must be in (0, 1] (got {utilization})");
        return Err(Fail::input(m));
    }
    let ppm = (utilization * 1e6).round() as u64;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let ms = |ns: u64| ns as f64 / 1e6;
    println!(
        "{:<24} {:<5} {:<16} {:>8} {:>8} {:>9} {:>8} {:>9} {:>10} {:>12}",
        "profile",
        "prec",
        "gpu",
        "weights",
        "kv",
        "kv_blocks",
        "step_1",
        "step_256",
        "prefill_2k",
        "seqs/tokens"
    );
    println!(
        "{:<24} {:<5} {:<16} {:>8} {:>8} {:>9} {:>8} {:>9} {:>10} {:>12}",
        "", "", "", "GiB/GPU", "GiB/GPU", "16-token", "ms", "ms@1k", "ms", "vLLM"
    );
    for p in PROFILES {
        let batched = p.max_num_batched_tokens as u64;
        let plan = p.plan(ppm, batched);
        let model = p.model(false).expect("every profile has a roofline");
        let mut one = StepShape::default();
        one.add_decode(0);
        let mut busy = StepShape::default();
        (0..256).for_each(|_| busy.add_decode(1024));
        let mut prefill = StepShape::default();
        prefill.add_prefill(0, 2048);
        let gpu = format!("{}x{}", p.tp, p.gpu.name.trim_end_matches("-80GB"));
        println!(
            "{:<24} {:<5} {:<16} {:>8.2} {:>8.2} {:>9} {:>8.2} {:>9.2} {:>10.2} {:>12}",
            p.name,
            p.precision.name(),
            gpu,
            gib(plan.weight_bytes),
            gib(plan.kv_bytes),
            plan.kv_tokens / 16,
            ms(model.step_ns(one)),
            ms(model.step_ns(busy)),
            ms(model.step_ns(prefill)),
            format!("{}/{}", p.max_num_seqs, p.max_num_batched_tokens)
        );
    }
    println!(
        "kv: what is left of {utilization} of 79.22 GiB per GPU after weights, runtime and the \
         activation peak (step_256: 256 decodes of 1,024-token context)"
    );
    Ok(())
}

/// The grid of the template table: prefill tokens, decode sequences, KV tokens read.
const PREFILL: [u64; 5] = [0, 128, 512, 2048, 8192];
const SEQS: [u64; 6] = [0, 1, 16, 64, 256, 1024];
const KV: [u64; 4] = [0, 16_384, 131_072, 1_048_576];

/// `profiles --table NAME`: the profile's roofline sampled on a grid, as a `Table` CSV.
pub fn table(name: &str) -> Outcome {
    let Some(p) = gpu::profile(name) else {
        let known: Vec<&str> = PROFILES.iter().map(|p| p.name).collect();
        let m = format!("unknown profile {name:?}; known: {}", known.join(", "));
        return Err(Fail::input(m));
    };
    let model = p.model(false).expect("every profile has a roofline");
    println!("# {name}'s roofline sampled by `cancelsim profiles --table {name}`: a template;");
    println!("# replace step_ms with times measured on your GPU (see README, Table profiles).");
    println!("{}", cancelsim::step_table::HEADER);
    for prefill in PREFILL {
        for seqs in SEQS {
            for kv in KV {
                let mut shape = StepShape::default();
                shape.add_prefill(0, prefill);
                shape.decode_seqs = seqs;
                shape.kv_tokens_read = kv;
                let ms = model.step_ns(shape) as f64 / 1e6;
                println!("{prefill},{seqs},{kv},{ms:.4}");
            }
        }
    }
    Ok(())
}
