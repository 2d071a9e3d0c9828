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
        "kv: what is left of {utilization} of each GPU's memory after weights, runtime and the \
         activation peak (step_256: 256 decodes of 1,024-token context)"
    );
    Ok(())
}

/// The grid of the template table: prefill tokens, decode sequences, KV tokens read.
const PREFILL: [u64; 5] = [0, 128, 512, 2048, 8192];
const SEQS: [u64; 6] = [0, 1, 16, 64, 256, 1024];
const KV: [u64; 4] = [0, 16_384, 131_072, 1_048_576];

/// The named profile, or the one-line refusal that lists the known names.
fn named(name: &str) -> Result<gpu::Profile, Fail> {
    gpu::profile(name).ok_or_else(|| Fail::input(gpu::unknown_profile(name)))
}

/// The step a table row stands for: one prompt of `prefill` tokens from nothing cached, and
/// `seqs` decodes reading `kv` KV tokens in all.
fn row_shape(prefill: u64, seqs: u64, kv: u64) -> StepShape {
    let mut shape = StepShape::default();
    shape.add_prefill(0, prefill);
    shape.decode_seqs = seqs;
    shape.kv_tokens_read = kv;
    shape
}

/// `profiles --check TABLE --against NAME`: each measured point beside the profile's roofline,
/// with the relative error, then the median and largest error. A table whose header names
/// another model shape than the profile's (its `# model shape` line, as `tools/profile`
/// writes it), or none, is refused.
pub fn check(path: &std::path::Path, name: &str) -> Outcome {
    let p = named(name)?;
    let measured = cancelsim::step_table::load_rows(path).map_err(Fail::input)?;
    let shown = cancelsim::input::shown(path);
    let Some(shape) = measured.model_shape.as_deref() else {
        let m = format!("{shown}: names no model shape (a `# model shape NAME` line, as tools/profile writes); cannot check it against {name}");
        return Err(Fail::input(m));
    };
    if shape != gpu::model_shape_name(name) {
        let m = format!(
            "{shown}: measures the model shape {shape:?}, not {name}'s ({:?})",
            gpu::model_shape_name(name)
        );
        return Err(Fail::input(m));
    }
    let model = p.model(false).expect("every profile has a roofline");
    println!("prefill_tokens,decode_seqs,kv_tokens,measured_ms,roofline_ms,error_pct");
    let mut errors = Vec::new();
    for &(prefill, seqs, kv, ns) in &measured.rows {
        let model_ms = model.step_ns(row_shape(prefill, seqs, kv)) as f64 / 1e6;
        let ms = ns as f64 / 1e6;
        // A step with no work in it (no prompt, no decode) is never run; its time is a filler.
        if prefill + seqs == 0 {
            println!("{prefill},{seqs},{kv},{ms:.4},{model_ms:.4},-");
            continue;
        }
        let e = (model_ms / ms - 1.0) * 100.0;
        errors.push(e.abs());
        println!("{prefill},{seqs},{kv},{ms:.4},{model_ms:.4},{e:+.1}");
    }
    errors.sort_by(f64::total_cmp);
    let Some(&max) = errors.last() else {
        return Err(Fail::input(format!(
            "{shown}: no step with work in it to check"
        )));
    };
    let median = errors[errors.len() / 2];
    eprintln!(
        "{name} against {shown}: {} points, |error| median {median:.1} %, max {max:.1} % \
         (steps with no work in them are left out)",
        errors.len()
    );
    Ok(())
}

/// `profiles --table NAME`: the profile's roofline sampled on a grid, as a `Table` CSV.
pub fn table(name: &str) -> Outcome {
    let p = named(name)?;
    let model = p.model(false).expect("every profile has a roofline");
    println!("# {name}'s roofline sampled by `cancelsim profiles --table {name}`: a template;");
    println!("# replace step_ms with times measured on your GPU (docs/scenarios.md, step tables).");
    println!("# model shape {}", gpu::model_shape_name(name));
    println!("{}", cancelsim::step_table::HEADER);
    for prefill in PREFILL {
        for seqs in SEQS {
            for kv in KV {
                let ms = model.step_ns(row_shape(prefill, seqs, kv)) as f64 / 1e6;
                println!("{prefill},{seqs},{kv},{ms:.4}");
            }
        }
    }
    Ok(())
}
