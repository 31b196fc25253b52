//! LoRA adapters in PEFT's layout (`adapter_model.safetensors`,
//! `adapter_config.json`) and octet's record of a LoRA run (`octet_lora.json`).

use super::*;

/// The `base_model_name_or_path` of an adapter trained on `base` (`None`: a
/// random base, [`RANDOM_BASE`]): the directory made absolute where it can
/// be, so that a resume from another working directory still matches it.
pub fn base_record(base: Option<&Path>) -> String {
    match base {
        None => RANDOM_BASE.to_string(),
        Some(p) => std::fs::canonicalize(p)
            .unwrap_or_else(|_| p.to_path_buf())
            .display()
            .to_string(),
    }
}

/// Whether an adapter whose config records the base `recorded` (as
/// [`base_record`] writes it) was trained on `base` (`None`: random).
/// Paths compare after both are made absolute where they exist.
pub fn same_base(recorded: &str, base: Option<&Path>) -> bool {
    match base {
        None => recorded == RANDOM_BASE,
        Some(_) if recorded == RANDOM_BASE => false,
        Some(p) => {
            let rec = Path::new(recorded);
            let canon = |q: &Path| std::fs::canonicalize(q).unwrap_or_else(|_| q.to_path_buf());
            rec == p || canon(rec) == canon(p)
        }
    }
}

/// The base an adapter directory records (`base_model_name_or_path` of its
/// `adapter_config.json`): `None` where it is null or missing (adapters
/// saved before octet recorded it, and PEFT's saved without one).
pub fn load_adapter_base(dir: &Path) -> Result<Option<String>> {
    let (v, p) = adapter_config_json(dir)?;
    let bad = |m: String| Error::Checkpoint(format!("{}: {m}", p.display()));
    match &v["base_model_name_or_path"] {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::String(s) => Ok(Some(s.clone())),
        other => Err(bad(format!(
            "base_model_name_or_path = {other}: expected a string or null"
        ))),
    }
}

/// An adapter directory's `adapter_config.json`, parsed, with its path (for
/// errors, which name it).
pub(super) fn adapter_config_json(dir: &Path) -> Result<(serde_json::Value, PathBuf)> {
    let p = dir.join("adapter_config.json");
    let bad = |e: String| Error::Checkpoint(format!("{}: {e}", p.display()));
    let text = std::fs::read_to_string(&p).map_err(|e| bad(e.to_string()))?;
    let v = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    Ok((v, p))
}

/// Write a LoRA model's adapter in PEFT's layout: `adapter_model.safetensors`
/// (`base_model.model.<module>.lora_A/lora_B.weight`) and `adapter_config.json`
/// recording `base` as `base_model_name_or_path` (see [`base_record`]; `None`
/// writes null: the base is not known).
pub fn save_adapter(dir: &Path, model: &Llama, base: Option<&str>) -> Result<()> {
    let (r, alpha, targets) = model
        .lora_summary()
        .ok_or_else(|| Error::Checkpoint("the model has no LoRA adapter".into()))?;
    let tensors: Vec<(String, Tensor)> = model
        .params()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    write_adapter(
        dir,
        &tensors,
        (r, alpha, &targets, model.lora_dropout()),
        base,
    )
}

/// Write adapter tensors (PEFT names) in PEFT's layout, with their rank,
/// alpha, target module names (`q_proj`, ...), the dropout they trained with
/// and the base they trained on (`base_model_name_or_path`, as
/// [`save_adapter`] takes it).
pub fn write_adapter(
    dir: &Path,
    tensors: &[(String, Tensor)],
    (r, alpha, targets, dropout): (usize, f64, &[String], f64),
    base: Option<&str>,
) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::Checkpoint(format!("{}: {e}", dir.display())))?;
    write_tensors(
        &dir.join("adapter_model.safetensors"),
        tensors
            .iter()
            .map(|(n, t)| (n.clone(), Lazy::Tensor(t)))
            .collect(),
        None,
    )?;
    let cfg = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": r,
        "lora_alpha": alpha,
        "target_modules": targets,
        "lora_dropout": dropout,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "base_model_name_or_path": base,
    });
    let text = serde_json::to_string_pretty(&cfg).map_err(|e| Error::Checkpoint(e.to_string()))?;
    write_atomic(&dir.join("adapter_config.json"), text.as_bytes())
}

/// How an adapter was trained, beyond what PEFT's `adapter_config.json`
/// holds: the form of its frozen base (`fp8-tensorwise`, `fp8-rowwise`,
/// `fp8-block`, `bf16`) and its compute (`fp8`, `bf16`). octet writes it
/// beside the adapter as `octet_lora.json`, so that a resume keeps them and a
/// merge defaults to the base the adapter learned to correct.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoraRecord {
    /// `octet lora --base-format`.
    pub base_format: String,
    /// `octet lora --compute`.
    pub compute: String,
}

/// The file [`LoraRecord`] is written to, in an adapter's directory.
pub const LORA_RECORD: &str = "octet_lora.json";

/// Write `rec` into the adapter directory `dir` (atomically).
pub fn write_lora_record(dir: &Path, rec: &LoraRecord) -> Result<()> {
    let text = serde_json::to_string_pretty(rec).map_err(|e| Error::Checkpoint(e.to_string()))?;
    write_atomic(&dir.join(LORA_RECORD), text.as_bytes())
}

/// The [`LoraRecord`] of the adapter directory `dir`: `None` where there is
/// none (adapters saved before octet wrote one, or by PEFT); an error naming
/// the file where it cannot be read or parsed, or where its base format or
/// compute is not one octet knows (else the merge or resume that reads it
/// reports a bad "model config" without saying where the value came from).
pub fn load_lora_record(dir: &Path) -> Result<Option<LoraRecord>> {
    let p = dir.join(LORA_RECORD);
    let text = match std::fs::read_to_string(&p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::file("reading", &p)(e)),
        Ok(t) => t,
    };
    let bad = |e: &dyn std::fmt::Display| Error::Checkpoint(format!("{}: {e}", p.display()));
    let rec: LoraRecord = serde_json::from_str(&text).map_err(|e| bad(&e))?;
    octet_nn::lora::BaseFormat::from_name(&rec.base_format).map_err(|e| bad(&e))?;
    octet_nn::lora::Compute::from_name(&rec.compute).map_err(|e| bad(&e))?;
    Ok(Some(rec))
}

/// An adapter's tensors, rank, alpha and target module names.
pub type Adapter = (HashMap<String, Tensor>, usize, f64, Vec<String>);

/// Read an adapter written by [`save_adapter`] (or by PEFT): its tensors and
/// `(r, alpha, target module names)`.
pub fn load_adapter(dir: &Path) -> Result<Adapter> {
    let (r, alpha, targets) = load_adapter_config(dir)?;
    let (w, _) = read_tensors(&dir.join("adapter_model.safetensors"))?;
    Ok((w, r, alpha, targets))
}

/// The `lora_dropout` an adapter directory's `adapter_config.json` records:
/// `None` where it is missing or null; an error where it is not a number in
/// `[0, 1)`.
pub fn load_adapter_dropout(dir: &Path) -> Result<Option<f64>> {
    let (v, p) = adapter_config_json(dir)?;
    match &v["lora_dropout"] {
        serde_json::Value::Null => Ok(None),
        d => match d.as_f64() {
            Some(x) if (0.0..1.0).contains(&x) => Ok(Some(x)),
            _ => Err(Error::Checkpoint(format!(
                "{}: lora_dropout = {d}: expected a probability in [0, 1)",
                p.display()
            ))),
        },
    }
}

/// Read `adapter_config.json` alone: `(r, alpha, target module names)`,
/// with `r` an integer between 1 and
/// [`MAX_LORA_RANK`](octet_nn::lora::MAX_LORA_RANK).
pub fn load_adapter_config(dir: &Path) -> Result<(usize, f64, Vec<String>)> {
    let (v, p) = adapter_config_json(dir)?;
    let bad = |m: &str| Error::Checkpoint(format!("{}: {m}", p.display()));
    let max = octet_nn::lora::MAX_LORA_RANK;
    let r = match &v["r"] {
        serde_json::Value::Null => return Err(bad("missing r")),
        rv => match rv.as_u64().map(usize::try_from) {
            Some(Ok(r)) if (1..=max).contains(&r) => r,
            _ => {
                return Err(bad(&format!(
                    "r = {rv}: a LoRA rank must be an integer between 1 and {max}"
                )))
            }
        },
    };
    let alpha = v["lora_alpha"]
        .as_f64()
        .ok_or_else(|| bad("missing lora_alpha"))?;
    if !(alpha.is_finite() && alpha > 0.0) {
        return Err(bad(&format!(
            "lora_alpha = {alpha}: a LoRA alpha must be a finite number above 0"
        )));
    }
    if let Some(t) = v["target_modules"].as_str() {
        // PEFT matches a string against whole module names as a regular expression.
        return Err(bad(&format!(
            "target_modules is the string {t:?}, which PEFT reads as a regular expression over \
             full module names; octet takes a list of module names (e.g. [\"q_proj\", \"v_proj\"])"
        )));
    }
    let targets = v["target_modules"]
        .as_array()
        .ok_or_else(|| bad("missing target_modules"))?
        .iter()
        .map(|t| {
            t.as_str()
                .map(String::from)
                .ok_or_else(|| bad(&format!("target_modules entry {t}: expected a module name")))
        })
        .collect::<Result<Vec<_>>>()?;
    // PEFT options that change what the adapter computes: read as plain
    // LoRA (`W + (alpha/r) B A`, one r and alpha) they would merge and train
    // something else without a word.
    for key in ["use_rslora", "use_dora", "fan_in_fan_out"] {
        if v[key] == serde_json::Value::Bool(true) {
            return Err(bad(&format!(
                "{key} = true is not supported: octet reads plain LoRA adapters (W + (alpha/r) B A)"
            )));
        }
    }
    for key in ["rank_pattern", "alpha_pattern"] {
        let set = match &v[key] {
            serde_json::Value::Null => false,
            serde_json::Value::Object(o) => !o.is_empty(),
            _ => true,
        };
        if set {
            return Err(bad(&format!(
                "{key} = {}: per-module ranks and alphas are not supported (one r and lora_alpha for every module)",
                v[key]
            )));
        }
    }
    Ok((r, alpha, targets))
}
