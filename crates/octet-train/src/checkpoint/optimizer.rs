//! The optimizer state of a checkpoint (`optimizer.safetensors`): AdamW's
//! masters and moments, the step, the trainer's settings and delayed scaling's state.

use super::*;

/// Save the optimizer state with `trainer` metadata (JSON text) and the
/// model's delayed-scaling state (`scaling`, JSON) into `dir`.
pub fn save_optimizer(dir: &Path, opt: &AdamW, trainer: &str, scaling: &str) -> Result<()> {
    let mut tensors = Vec::with_capacity(3 * opt.states.len());
    for s in &opt.states {
        for (suffix, v) in [
            ("master", &s.master),
            ("exp_avg", &s.m),
            ("exp_avg_sq", &s.v),
        ] {
            tensors.push((
                format!("{}.{suffix}", s.name),
                Lazy::F32(v.as_slice(), s.shape.as_slice()),
            ));
        }
    }
    let meta = HashMap::from([
        ("step".to_string(), opt.step.to_string()),
        (
            "adamw".to_string(),
            serde_json::to_string(&opt.cfg).map_err(|e| Error::Checkpoint(e.to_string()))?,
        ),
        ("trainer".to_string(), trainer.to_string()),
        ("scaling".to_string(), scaling.to_string()),
    ]);
    write_tensors(&dir.join("optimizer.safetensors"), tensors, Some(meta))
}

/// Load the optimizer state for `model`'s parameters and restore the model's
/// delayed-scaling state; returns the optimizer and the trainer metadata.
pub fn load_optimizer(dir: &Path, model: &mut Llama) -> Result<(AdamW, String)> {
    let params: Vec<(String, Vec<usize>)> = model
        .params()
        .into_iter()
        .map(|(n, p)| (n, p.shape().to_vec()))
        .collect();
    let (opt, trainer, scaling) = load_optimizer_for(dir, &params)?;
    if let Some(scaling) = scaling {
        model
            .set_scaling_state(scaling)
            .map_err(|e| Error::Checkpoint(format!("{}: {e}", dir.display())))?;
    }
    Ok((opt, trainer))
}

/// The optimizer step of a checkpoint's metadata: a number of at most
/// [`MAX_STEPS`](crate::trainer::MAX_STEPS).
pub(super) fn parse_step(text: Option<&String>) -> std::result::Result<u64, String> {
    let text = text.ok_or_else(|| "missing step".to_string())?;
    let step: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("step '{text}' is not a step count"))?;
    let max = crate::trainer::MAX_STEPS;
    if step > max {
        return Err(format!("step {step} exceeds the limit of {max}"));
    }
    Ok(step)
}

/// The optimizer step a checkpoint directory was saved at, read from the
/// header of its `optimizer.safetensors` alone (the tensors are not read).
pub fn read_step(dir: &Path) -> Result<u64> {
    let path = dir.join("optimizer.safetensors");
    let bad = |e: String| Error::Checkpoint(format!("{}: {e}", path.display()));
    let meta = read_optimizer_metadata(dir)?;
    let step = meta["step"].as_str().map(String::from);
    parse_step(step.as_ref()).map_err(bad)
}

/// The settings of the run that saved the checkpoint in `dir` (the
/// `trainer` metadata of its `optimizer.safetensors`, the run's
/// [`TrainConfig`](crate::trainer::TrainConfig) as JSON), read from the header alone;
/// `None` where the checkpoint records none (`{}` or no key).
pub fn read_trainer_settings(dir: &Path) -> Result<Option<String>> {
    let meta = read_optimizer_metadata(dir)?;
    Ok(meta["trainer"]
        .as_str()
        .filter(|t| !t.trim().is_empty() && t.trim() != "{}")
        .map(String::from))
}

/// The `__metadata__` of `dir/optimizer.safetensors`, from its header only
/// (an optimizer file is three times the model's size).
pub(super) fn read_optimizer_metadata(dir: &Path) -> Result<serde_json::Value> {
    let mut v = read_header(&dir.join("optimizer.safetensors"))?;
    Ok(v.get_mut("__metadata__")
        .map_or(serde_json::Value::Null, serde_json::Value::take))
}

/// How the checkpoint in `dir` stores its FP8 block matrices (`*_proj.weight`
/// of dtype `F8_E4M3` or `F8_E5M2`), from the headers of its weights
/// (`model.safetensors` or every shard) alone: the scaling their factors'
/// shapes give (see the module docs), `Some(None)` where they differ between matrices, and `None`
/// where no block matrix is stored in FP8. A LoRA base keeps such matrices
/// as stored whatever FP8 form it is asked for.
pub fn stored_fp8_scaling(dir: &Path) -> Result<Option<Option<WeightScaling>>> {
    // No weights (yet): what reads them names the path.
    let Some(header) = shards::read_model_header(dir)? else {
        return Ok(None);
    };
    let Some(map) = header.as_object() else {
        return Ok(None);
    };
    let shape = |name: &str| -> Option<Vec<usize>> {
        map.get(name)?["shape"]
            .as_array()?
            .iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect()
    };
    let mut found: Option<Option<WeightScaling>> = None;
    for (name, info) in map {
        let fp8 = matches!(info["dtype"].as_str(), Some("F8_E4M3" | "F8_E5M2"));
        if !fp8 || !name.ends_with("_proj.weight") {
            continue;
        }
        let dims = shape(name).and_then(|s| <[usize; 2]>::try_from(s).ok());
        let factors =
            shape(&format!("{name}_scale")).or_else(|| shape(&format!("{name}_scale_inv")));
        // Anything else is for `load_weights_fp8` to name.
        let (Some([n, k]), Some(d)) = (dims, factors) else {
            continue;
        };
        let scaling = match d.as_slice() {
            d if d.iter().product::<usize>() == 1 => WeightScaling::Tensor,
            [r] | [r, 1] if *r == n => WeightScaling::Channel,
            [r, c] if (*r, *c) == (n.div_ceil(128), k.div_ceil(128)) => WeightScaling::Block128,
            _ => continue,
        };
        found = Some(match found {
            None => Some(scaling),
            Some(Some(s)) if s == scaling => Some(s),
            Some(_) => None,
        });
    }
    Ok(found)
}

/// The JSON header of the safetensors file at `path`, read without its data.
pub(super) fn read_header(path: &Path) -> Result<serde_json::Value> {
    use std::io::Read;
    let bad = |e: String| Error::Checkpoint(format!("{}: {e}", path.display()));
    let mut f = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    if f.metadata().is_ok_and(|m| m.is_dir()) {
        return Err(not_a_file(path));
    }
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|e| bad(format!("no safetensors header ({e})")))?;
    // The safetensors crate's own bound on a header.
    const MAX_HEADER: u64 = 100_000_000;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER {
        return Err(bad(format!(
            "a header of {n} bytes exceeds the limit of {MAX_HEADER}"
        )));
    }
    let mut header = Vec::new();
    f.take(n)
        .read_to_end(&mut header)
        .map_err(|e| bad(e.to_string()))?;
    if header.len() as u64 != n {
        return Err(bad(format!(
            "the header is cut short ({} of {n} bytes)",
            header.len()
        )));
    }
    serde_json::from_slice(&header)
        .map_err(|e| bad(format!("not a valid safetensors header ({e})")))
}

/// Delayed-scaling state of a checkpoint: `(layer, role, state)`.
pub type ScalingState = Vec<(String, Role, DelayedState)>;

/// Load the optimizer state of the parameters `params` (names and shapes,
/// in order; every one must be there with its master and both moments):
/// the optimizer, the trainer metadata, and the delayed-scaling state if saved.
pub fn load_optimizer_for(
    dir: &Path,
    params: &[(String, Vec<usize>)],
) -> Result<(AdamW, String, Option<ScalingState>)> {
    let path = dir.join("optimizer.safetensors");
    let (mut t, meta) = read_tensors(&path)?;
    let bad = |m: String| Error::Checkpoint(format!("{}: {m}", path.display()));
    let step = parse_step(meta.get("step")).map_err(bad)?;
    let cfg: AdamWConfig = meta
        .get("adamw")
        .and_then(|s| serde_json::from_str(s).ok())
        .ok_or_else(|| bad("missing adamw config".into()))?;
    cfg.validate().map_err(|e| match e {
        Error::Train(m) => bad(m),
        e => e,
    })?;
    let mut states = Vec::new();
    for (name, shape) in params {
        let mut take = |suffix: &str| -> Result<Vec<f32>> {
            let key = format!("{name}.{suffix}");
            let v = t
                .remove(&key)
                .ok_or_else(|| bad(format!("missing tensor {key}")))?;
            if v.shape() != shape.as_slice() {
                return Err(bad(format!(
                    "tensor {key} has shape {:?}, parameter is {:?}",
                    v.shape(),
                    shape
                )));
            }
            Ok(v.to_f32_vec())
        };
        let (master, m, v) = (take("master")?, take("exp_avg")?, take("exp_avg_sq")?);
        states.push(ParamState {
            name: name.clone(),
            shape: shape.clone(),
            master,
            m,
            v,
            decay: shape.len() >= 2,
        });
    }
    let scaling = match meta.get("scaling") {
        Some(text) => Some(
            serde_json::from_str::<ScalingState>(text)
                .map_err(|e| bad(format!("scaling state: {e}")))?,
        ),
        None => None,
    };
    let trainer = meta.get("trainer").cloned().unwrap_or_default();
    Ok((AdamW { cfg, states, step }, trainer, scaling))
}
