//! Fine-tuning data as JSONL: one example a line, tokenized with a mask of
//! the tokens the loss counts.
//!
//! | line                                      | tokens                                   | counted (`--loss-on completion`) |
//! |-------------------------------------------|------------------------------------------|----------------------------------|
//! | `{"text": t}`                             | `t` with the tokenizer's specials, EOS   | all                              |
//! | `{"prompt": p, "completion": c}`          | `p` with specials, then `c`, EOS         | `c` and the EOS                  |
//! | `{"messages": [{"role", "content"}, ...]}`| the chat template's text (no specials    | the assistant messages (each     |
//! |                                           | added: the template writes them)         | with its end-of-turn text)       |
//!
//! `--loss-on all` counts every token. The EOS is the model folder's
//! (`tokenizer_config.json`'s `eos_token`), none under `byte` and `gpt2`.
//!
//! An assistant message's text is found by rendering prefixes: the
//! conversation before the message must render as a prefix of the
//! conversation through it, and that as a prefix of the whole; the text
//! past the before-rendering and past what the generation prompt shares
//! with the through-rendering (the assistant's header) is the assistant's,
//! and a token counts where its first byte falls in such a text. A template that renders a conversation's
//! beginning otherwise once it goes on (one that drops earlier reasoning, say)
//! is an error that says to use `--loss-on all`.
//!
//! Examples are packed: their tokens follow one another in one stream, and
//! training windows are drawn from it as from a text corpus, each target
//! keeping its mask. Attention is not cut at example boundaries.

use crate::data::Tokenizer;
use crate::hf_tokenizer::HfTokenizer;
use crate::{Error, Result};
use std::path::Path;

/// Which tokens of fine-tuning data the loss counts (`--loss-on`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LossOn {
    /// Completions and assistant messages only (and all of a `{"text"}` line).
    #[default]
    Completion,
    /// Every token.
    All,
}

impl LossOn {
    /// `completion` or `all`.
    pub fn from_name(name: &str) -> Result<LossOn> {
        match name {
            "completion" => Ok(LossOn::Completion),
            "all" => Ok(LossOn::All),
            other => Err(Error::Data(format!(
                "--loss-on {other}: expected completion or all"
            ))),
        }
    }
}

/// Tokens of a JSONL file, packed, and whether each counts as a target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Packed {
    /// The examples' tokens, one after another.
    pub tokens: Vec<u32>,
    /// Per token: whether the loss counts it (as the target of the token before).
    pub counted: Vec<bool>,
}

impl Packed {
    fn push(&mut self, ids: &[u32], counted: bool) {
        self.tokens.extend_from_slice(ids);
        self.counted.extend(std::iter::repeat_n(counted, ids.len()));
    }
}

/// Whether `path` names fine-tuning JSONL (by its extension).
pub fn is_jsonl(path: &Path) -> bool {
    path.extension().is_some_and(|x| x == "jsonl")
}

/// Read and tokenize the JSONL file at `path` (see the module docs). A line
/// that is not an example is an error naming the file and the line number;
/// a chat template that fails, one naming the template's file too.
pub fn load_jsonl(path: &Path, tok: &Tokenizer, loss_on: LossOn) -> Result<Packed> {
    let text = std::fs::read_to_string(path).map_err(Error::file("reading", path))?;
    let mut out = Packed::default();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = |m: String| Error::Data(format!("{}:{}: {m}", path.display(), i + 1));
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| at(format!("not valid JSON ({e})")))?;
        example((line, &v), tok, loss_on, &mut out).map_err(|e| match e {
            Error::Data(m) => at(m),
            e => e,
        })?;
    }
    if out.tokens.is_empty() {
        return Err(Error::Data(format!(
            "{}: no examples (one JSON object a line)",
            path.display()
        )));
    }
    Ok(out)
}

/// A string field of an example: `None` where absent, an error where it
/// is not a string.
fn field<'a>(v: &'a serde_json::Value, key: &str) -> Result<Option<&'a str>> {
    match v.get(key) {
        None => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(Error::Data(format!(
            "\"{key}\" is {other}: expected a string"
        ))),
    }
}

/// Tokenize one example (its line, and the line parsed) onto `out`.
fn example(
    (line, v): (&str, &serde_json::Value),
    tok: &Tokenizer,
    loss_on: LossOn,
    out: &mut Packed,
) -> Result<()> {
    let all = loss_on == LossOn::All;
    let obj = v.as_object().ok_or_else(|| {
        Error::Data(format!(
            "{v}: expected an object with \"text\", \"prompt\" and \"completion\", or \"messages\""
        ))
    })?;
    let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    let has = |k: &str| obj.contains_key(k);
    let eos: Vec<u32> = match tok {
        Tokenizer::Hf(t) => t.eos.iter().map(|e| e.id).collect(),
        _ => Vec::new(),
    };
    let encode = |text: &str, special: bool| -> Result<Vec<u32>> {
        match tok {
            Tokenizer::Hf(t) => t.encode(text, special),
            other => Ok(other.encode(text)),
        }
    };
    match (has("text"), has("prompt") || has("completion"), has("messages")) {
        (true, false, false) => {
            let text = field(v, "text")?.unwrap_or_default();
            out.push(&encode(text, true)?, true);
            out.push(&eos, true);
        }
        (false, true, false) => {
            let (Some(p), Some(c)) = (field(v, "prompt")?, field(v, "completion")?) else {
                return Err(Error::Data(
                    "an example with \"prompt\" needs \"completion\" too, and the other way round"
                        .into(),
                ));
            };
            out.push(&encode(p, true)?, all);
            out.push(&encode(c, false)?, true);
            out.push(&eos, true);
        }
        (false, false, true) => {
            let Tokenizer::Hf(t) = tok else {
                return Err(Error::Data(format!(
                    "\"messages\" are rendered by a model's chat template; --tokenizer {} has none (give a model folder with tokenizer.json and a chat_template)",
                    tok.name()
                )));
            };
            messages(t, (line, &v["messages"]), all, out)?;
        }
        _ => {
            return Err(Error::Data(format!(
                "keys {keys:?}: expected \"text\", \"prompt\" and \"completion\", or \"messages\" (one of these forms)"
            )))
        }
    }
    Ok(())
}

/// Render and tokenize a conversation (its line, and its messages parsed)
/// onto `out`, the assistant messages' text counted (every token with `all`).
fn messages(
    t: &HfTokenizer,
    (line, msgs): (&str, &serde_json::Value),
    all: bool,
    out: &mut Packed,
) -> Result<()> {
    let checked = msgs
        .as_array()
        .filter(|l| !l.is_empty())
        .ok_or_else(|| Error::Data("\"messages\" must be a non-empty list".into()))?;
    for (j, m) in checked.iter().enumerate() {
        let ok = m["role"].is_string() && (m["content"].is_string() || m["content"].is_array());
        if !ok {
            return Err(Error::Data(format!(
                "messages[{j}] = {m}: expected {{\"role\": ..., \"content\": ...}}"
            )));
        }
    }
    // Parsed again for the template: keys in the order the line gives them
    // (serde_json's maps sort them), as Python's dicts keep them.
    #[derive(serde::Deserialize)]
    struct Line {
        messages: Vec<minijinja::Value>,
    }
    let list = serde_json::from_str::<Line>(line)
        .map_err(|e| Error::Data(format!("messages: {e}")))?
        .messages;
    let full = t.render_chat(&list, false)?;
    let (ids, offsets) = t.encode_offsets(&full, false)?;
    if all {
        out.push(&ids, true);
        return Ok(());
    }
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for (j, m) in checked.iter().enumerate() {
        if m["role"] != "assistant" {
            continue;
        }
        let base = t.render_chat(&list[..j], false)?;
        let prompted = t.render_chat(&list[..j], true)?;
        let through = t.render_chat(&list[..=j], false)?;
        if !through.starts_with(&base) || !full.starts_with(&through) {
            let file = t
                .chat_template
                .as_ref()
                .map(|c| c.file.display().to_string())
                .unwrap_or_default();
            return Err(Error::Data(format!(
                "the chat template of {file} renders the conversation's beginning otherwise \
                 once it goes on (at messages[{j}]), so its assistant tokens cannot be told \
                 apart; give --loss-on all to count every token"
            )));
        }
        // The generation prompt is the assistant's header; what it shares
        // with the message's rendering is not the assistant's text (a
        // template may end the prompt with whitespace the message lacks).
        let mut common = prompted
            .bytes()
            .zip(through.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        while !through.is_char_boundary(common) {
            common -= 1;
        }
        spans.push((common.max(base.len()), through.len()));
    }
    for (&id, &(start, end)) in ids.iter().zip(&offsets) {
        // A token the tokenizer adds has an empty range at 0: never an assistant's.
        let counted = end > start && spans.iter().any(|&(a, b)| (a..b).contains(&start));
        out.push(&[id], counted);
    }
    Ok(())
}
