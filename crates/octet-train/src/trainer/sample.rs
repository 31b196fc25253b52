//! Evaluation, the end-of-run sample and the loss plot.

use super::*;

/// Mean validation loss over `n` deterministic batches.
pub fn evaluate(model: &mut Llama, data: &Dataset, cfg: &TrainConfig, n: usize) -> Result<f64> {
    let mut total = 0.0;
    for i in 0..n {
        let (x, y) = data.batch(Split::Val, cfg.batch, cfg.seq, cfg.seed, i as u64)?;
        let logits = model.logits(&x, cfg.batch, cfg.seq)?;
        total += octet_nn::loss::cross_entropy(&logits, &y)?.0;
    }
    Ok(total / n.max(1) as f64)
}

/// Sample `n` tokens after `prompt` (temperature 0.8, top 40, `seed`) with
/// a KV-cache decoder over the model's weights in f32 ([`DecodeModel`], what
/// `octet generate --weights f32` runs): one step a token while the sequence
/// fits the model's positions, the window sliding past them.
pub fn sample(model: &Llama, prompt: &[u32], n: usize, seed: u64) -> Result<Vec<u32>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let weights: HashMap<String, Tensor> = model
        .params()
        .into_iter()
        .map(|(name, t)| (name, t.clone()))
        .collect();
    let mut dec = DecodeModel::new(&model.cfg, &weights, WeightStorage::F32)?;
    let v = model.cfg.vocab_size;
    let ctx = model.cfg.max_position_embeddings;
    sample_windowed(prompt, n, ctx, seed, |feed| {
        let logits = match feed {
            Feed::Step(t) => dec.forward(&[t])?,
            Feed::Fill(window) => {
                dec.reset();
                dec.forward(window)?
            }
        };
        Ok(logits[logits.len() - v..].to_vec())
    })
}

/// [`sample`] without a cache: the model runs over the last `ctx` tokens
/// again for every token (the reference the decoders are checked against).
#[cfg(test)]
pub(crate) fn sample_rerun(
    model: &mut Llama,
    prompt: &[u32],
    n: usize,
    seed: u64,
) -> Result<Vec<u32>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut toks = prompt.to_vec();
    let ctx = model.cfg.max_position_embeddings;
    for _ in 0..n {
        let start = toks.len().saturating_sub(ctx);
        let window = &toks[start..];
        let logits = model.logits(window, 1, window.len())?;
        let v = model.cfg.vocab_size;
        let last: Vec<f32> = logits.to_f32_vec()[(window.len() - 1) * v..].to_vec();
        toks.push(pick_token(&last, 0.8, 40, &mut rng));
    }
    Ok(toks[prompt.len()..].to_vec())
}

/// What [`sample_windowed`] asks of a KV-cache decoder; either returns the
/// logits of the token it leaves last in the cache.
pub(crate) enum Feed<'a> {
    /// Append one token to the cache.
    Step(u32),
    /// Empty the cache and fill it with these tokens (positions from 0).
    Fill(&'a [u32]),
}

/// `n` tokens after `prompt`, each picked (temperature 0.8, top 40, `seed`)
/// from the logits of the last `ctx` tokens, as the CPU trainer's
/// [`sample_rerun`] picks them, on a decoder driven by `feed`:
/// while the sequence fits the `ctx` positions each token is one step;
/// past them the window slides, and the cache is filled with it again.
pub(crate) fn sample_windowed(
    prompt: &[u32],
    n: usize,
    ctx: usize,
    seed: u64,
    mut feed: impl FnMut(Feed<'_>) -> Result<Vec<f32>>,
) -> Result<Vec<u32>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if prompt.is_empty() || ctx == 0 {
        return Err(Error::Train(format!(
            "sampling needs a prompt and a context: {} prompt tokens, {ctx} positions",
            prompt.len()
        )));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut toks = prompt.to_vec();
    let mut logits = Vec::new();
    if prompt.len() <= ctx {
        for &t in prompt {
            logits = feed(Feed::Step(t))?;
        }
    } else {
        logits = feed(Feed::Fill(&toks[toks.len() - ctx..]))?;
    }
    for i in 0..n {
        let t = pick_token(&logits, 0.8, 40, &mut rng);
        toks.push(t);
        if i + 1 < n {
            logits = match toks.len() <= ctx {
                true => feed(Feed::Step(t))?,
                false => feed(Feed::Fill(&toks[toks.len() - ctx..]))?,
            };
        }
    }
    Ok(toks.split_off(prompt.len()))
}

/// Write `dir/loss.png` with the training and validation curves (`y_label`:
/// [`Tokenizer::loss_label`]); a plot that cannot be drawn is a note, not a
/// failed run.
pub fn plot_losses(
    dir: &Path,
    train_name: &str,
    y_label: &str,
    curve: Vec<(f64, f64)>,
    val_curve: Vec<(f64, f64)>,
    obs: &mut dyn Observer,
) {
    let series = [
        Series {
            name: train_name.to_string(),
            points: curve,
        },
        Series {
            name: "validation".into(),
            points: val_curve,
        },
    ];
    if let Err(e) = line_plot(
        &dir.join("loss.png"),
        "octet training loss",
        "step",
        y_label,
        &series,
    ) {
        obs.note(&format!("no plot: {e}"));
    }
}

/// Draw a token from `logits` with `temperature` among the `top_k` most likely.
pub fn pick_token(logits: &[f32], temperature: f32, top_k: usize, rng: &mut impl Rng) -> u32 {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    idx.truncate(top_k.max(1));
    let t = temperature.max(1e-3);
    let m = logits[idx[0]];
    let w: Vec<f64> = idx
        .iter()
        .map(|&i| (((logits[i] - m) / t) as f64).exp())
        .collect();
    let mut r = rng.random::<f64>() * w.iter().sum::<f64>();
    for (&i, &wi) in idx.iter().zip(&w) {
        if r < wi {
            return i as u32;
        }
        r -= wi;
    }
    idx[0] as u32
}
