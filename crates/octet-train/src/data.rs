//! Training data: a byte-level tokenizer, GPT-2's BPE or a model folder's
//! `tokenizer.json`, text or pre-tokenized token files or fine-tuning JSONL
//! ([`crate::finetune`]), a train/validation split, and deterministic batch
//! sampling.
//!
//! Batches are drawn by a generator seeded from `(seed, step)`, so a resumed
//! run sees exactly the batches the uninterrupted run would have seen without
//! saving any generator state.

use crate::hf_tokenizer::HfTokenizer;
use crate::{Error, Result};
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::sync::Arc;

/// Tiny Shakespeare (public domain), the embedded default corpus.
pub const DEFAULT_CORPUS: &str = include_str!("../data/tinyshakespeare.txt");

/// Byte-level tokenizer: token id = byte value, vocabulary of 256.
#[derive(Clone, Copy, Debug, Default)]
pub struct ByteTokenizer;

impl ByteTokenizer {
    /// Vocabulary size.
    pub const VOCAB: usize = 256;

    /// Encode text into token ids.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }

    /// Decode token ids (ids above 255 and invalid UTF-8 show as U+FFFD).
    pub fn decode(&self, tokens: &[u32]) -> String {
        String::from_utf8_lossy(&Tokenizer::Byte.decode_bytes(tokens)).into_owned()
    }
}

/// The tokenizers a run can use (`--tokenizer`).
#[derive(Clone, Debug, Default)]
pub enum Tokenizer {
    /// Byte-level: token id = byte value ([`ByteTokenizer`]), 256 ids.
    #[default]
    Byte,
    /// GPT-2's byte-level BPE (`r50k_base`, 50,257 ids), from the
    /// `tiktoken-rs` crate, which ships the vocabulary (no download).
    Gpt2,
    /// A Hugging Face `tokenizer.json` with its folder's special tokens and
    /// chat template ([`HfTokenizer`]).
    Hf(Arc<HfTokenizer>),
}

impl PartialEq for Tokenizer {
    fn eq(&self, other: &Tokenizer) -> bool {
        match (self, other) {
            (Tokenizer::Byte, Tokenizer::Byte) | (Tokenizer::Gpt2, Tokenizer::Gpt2) => true,
            (Tokenizer::Hf(a), Tokenizer::Hf(b)) => a.name() == b.name(),
            _ => false,
        }
    }
}

/// GPT-2's token ids.
const GPT2_VOCAB: usize = 50_257;

impl Tokenizer {
    /// `byte`, `gpt2`, or the path of a `tokenizer.json` or of a model
    /// folder holding one.
    pub fn from_name(name: &str) -> Result<Tokenizer> {
        match name {
            "byte" => Ok(Tokenizer::Byte),
            "gpt2" => Ok(Tokenizer::Gpt2),
            other if crate::hf_tokenizer::tokenizer_json(Path::new(other)).is_some() => {
                Ok(Tokenizer::Hf(HfTokenizer::load(Path::new(other))?))
            }
            other => Err(Error::Data(format!(
                "tokenizer '{other}': expected byte, gpt2, or a tokenizer.json (or a model folder holding one)"
            ))),
        }
    }

    /// The name [`Tokenizer::from_name`] takes (a `tokenizer.json`'s path).
    pub fn name(&self) -> &str {
        match self {
            Tokenizer::Byte => "byte",
            Tokenizer::Gpt2 => "gpt2",
            Tokenizer::Hf(t) => t.name(),
        }
    }

    /// The ids that end a generation: a `tokenizer.json` folder's EOS ids
    /// (none for byte and gpt2, whose models octet trains without one).
    pub fn eos_ids(&self) -> &[u32] {
        match self {
            Tokenizer::Hf(t) => &t.eos_ids,
            _ => &[],
        }
    }

    /// The y-axis label of a loss plot: the cross-entropy's unit is a nat
    /// per byte under the byte tokenizer and per token under BPE.
    pub fn loss_label(&self) -> &'static str {
        match self {
            Tokenizer::Byte => "cross-entropy (nats/byte)",
            Tokenizer::Gpt2 | Tokenizer::Hf(_) => "cross-entropy (nats/token)",
        }
    }

    /// How many token ids it produces (256; GPT-2's 50,257; a
    /// `tokenizer.json`'s largest id + 1).
    pub fn vocab(&self) -> usize {
        match self {
            Tokenizer::Byte => ByteTokenizer::VOCAB,
            Tokenizer::Gpt2 => GPT2_VOCAB,
            Tokenizer::Hf(t) => t.vocab(),
        }
    }

    /// The vocabulary of a model made for it: 256, or GPT-2's 50,257 rounded
    /// up to a multiple of 128 (50,304, as nanoGPT pads it: the LM head's
    /// GEMMs and kernels want multiples of 16). The extra ids never occur in
    /// the data.
    pub fn model_vocab(&self) -> usize {
        self.vocab().next_multiple_of(128).max(ByteTokenizer::VOCAB)
    }

    /// The tokenizer of a model with `vocab` ids, as octet makes them: 256
    /// for byte-level, 50,257 to 50,304 for GPT-2's.
    pub fn for_vocab(vocab: usize) -> Result<Tokenizer> {
        match vocab {
            256 => Ok(Tokenizer::Byte),
            v if (GPT2_VOCAB..=GPT2_VOCAB.next_multiple_of(128)).contains(&v) => {
                Ok(Tokenizer::Gpt2)
            }
            v => Err(Error::Data(format!(
                "no tokenizer of octet's for a vocabulary of {v} (byte: 256, gpt2: 50257 to 50304); give --tokenizer"
            ))),
        }
    }

    /// An error unless a model of `vocab` ids holds every id it makes.
    pub fn check_fits(&self, vocab: usize) -> Result<()> {
        if self.vocab() > vocab {
            return Err(Error::Data(format!(
                "--tokenizer {} makes {} token ids; the model's vocab_size is {vocab}",
                self.name(),
                self.vocab()
            )));
        }
        Ok(())
    }

    /// Encode text into token ids (GPT-2: special tokens such as
    /// `<|endoftext|>` are read as ordinary text; a `tokenizer.json`: with
    /// the special tokens its post-processor adds, as transformers'
    /// `tokenizer(text)`, and special tokens in the text read as such).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match self {
            Tokenizer::Byte => ByteTokenizer.encode(text),
            Tokenizer::Gpt2 => tiktoken_rs::r50k_base_singleton().encode_ordinary(text),
            // The tokenizers crate fails only on inputs its truncation or
            // padding settings refuse, which training files do not set.
            Tokenizer::Hf(t) => t.encode(text, true).unwrap_or_default(),
        }
    }

    /// Decode token ids to text (ids outside the vocabulary: U+FFFD under
    /// byte, left out under gpt2, whose model pads the vocabulary, and under
    /// a `tokenizer.json`, which also leaves out special tokens; invalid
    /// UTF-8 shows as U+FFFD).
    pub fn decode(&self, tokens: &[u32]) -> String {
        match self {
            Tokenizer::Byte => ByteTokenizer.decode(tokens),
            Tokenizer::Gpt2 => String::from_utf8_lossy(&self.decode_bytes(tokens)).into_owned(),
            Tokenizer::Hf(t) => t.decode(tokens),
        }
    }

    /// The bytes of token ids, as [`Tokenizer::decode`] reads them.
    pub fn decode_bytes(&self, tokens: &[u32]) -> Vec<u8> {
        match self {
            Tokenizer::Hf(t) => t.decode(tokens).into_bytes(),
            // 0xFF never occurs in UTF-8: it reads as one U+FFFD.
            Tokenizer::Byte => tokens
                .iter()
                .map(|&t| u8::try_from(t).unwrap_or(0xFF))
                .collect(),
            Tokenizer::Gpt2 => {
                let known: Vec<u32> = tokens
                    .iter()
                    .copied()
                    .filter(|&t| (t as usize) < GPT2_VOCAB)
                    .collect();
                tiktoken_rs::r50k_base_singleton()
                    .decode_bytes(&known)
                    .unwrap_or_default()
            }
        }
    }
}

/// Decodes tokens as they are sampled: a UTF-8 character whose bytes span
/// several tokens (every non-ASCII byte-level character, many of GPT-2's) is
/// held back until it is complete, so the pieces put together read as
/// [`Tokenizer::decode`] of all the tokens.
///
/// A `tokenizer.json`'s tokens are not each a run of bytes (a SentencePiece
/// `▁` is a space only inside a word): its stream decodes every token so far
/// and gives the text past what it gave before, holding back a decode that
/// ends in U+FFFD (a character not complete yet) or that rewrote earlier text.
#[derive(Clone, Debug)]
pub struct TextStream {
    tok: Tokenizer,
    pending: Vec<u8>,
    /// A `tokenizer.json`'s tokens so far, and the length of the text given.
    ids: Vec<u32>,
    given: usize,
}

impl TextStream {
    /// A stream of `tok`'s tokens.
    pub fn new(tok: Tokenizer) -> TextStream {
        TextStream {
            tok,
            pending: Vec::new(),
            ids: Vec::new(),
            given: 0,
        }
    }

    /// The text of `tokens` that is complete so far.
    pub fn push(&mut self, tokens: &[u32]) -> String {
        if let Tokenizer::Hf(t) = &self.tok {
            self.ids.extend_from_slice(tokens);
            let text = t.decode(&self.ids);
            if text.ends_with('\u{FFFD}') || text.len() < self.given {
                return String::new();
            }
            let Some(new) = text.get(self.given..) else {
                return String::new();
            };
            self.given = text.len();
            return new.to_string();
        }
        self.pending.extend(self.tok.decode_bytes(tokens));
        let keep = incomplete_tail(&self.pending);
        let rest = self.pending.split_off(self.pending.len() - keep);
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending = rest;
        text
    }

    /// What is left (an incomplete character shows as U+FFFD).
    pub fn finish(&mut self) -> String {
        if let Tokenizer::Hf(t) = &self.tok {
            let text = t.decode(&self.ids);
            let rest = text.get(self.given..).unwrap_or_default().to_string();
            self.given = text.len();
            return rest;
        }
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// How many bytes at the end of `b` begin a UTF-8 character that later
/// bytes may complete.
fn incomplete_tail(b: &[u8]) -> usize {
    for back in 1..=b.len().min(3) {
        let tail = &b[b.len() - back..];
        if tail[0] & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for its lead
        }
        return match std::str::from_utf8(tail) {
            Err(e) if e.valid_up_to() == 0 && e.error_len().is_none() => back,
            _ => 0,
        };
    }
    0
}

/// A tokenized corpus split into training and validation streams.
#[derive(Clone, Debug)]
pub struct Dataset {
    /// Training tokens.
    pub train: Vec<u32>,
    /// Validation tokens (the last `val_fraction` of the stream).
    pub val: Vec<u32>,
    /// Vocabulary size the tokens index into.
    pub vocab: usize,
    /// Fine-tuning data: per training token, whether the loss counts it as
    /// a target; `None`: every token counts.
    pub train_mask: Option<Vec<bool>>,
    /// The same for the validation tokens.
    pub val_mask: Option<Vec<bool>>,
}

impl Dataset {
    /// Split `tokens` into train and the trailing `val_fraction` for validation.
    pub fn from_tokens(tokens: Vec<u32>, vocab: usize, val_fraction: f64) -> Result<Dataset> {
        if let Some((i, &t)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= vocab)
        {
            return Err(Error::Data(format!(
                "token {t} at position {i} is outside the vocabulary of {vocab}"
            )));
        }
        let n_val = ((tokens.len() as f64) * val_fraction.clamp(0.0, 0.5)) as usize;
        let split = tokens.len() - n_val;
        let val = tokens[split..].to_vec();
        let mut train = tokens;
        train.truncate(split);
        Ok(Dataset {
            train,
            val,
            vocab,
            train_mask: None,
            val_mask: None,
        })
    }

    /// Fine-tuning examples packed with their mask ([`crate::finetune`]),
    /// split as [`Dataset::from_tokens`] splits tokens.
    pub fn from_packed(
        packed: crate::finetune::Packed,
        vocab: usize,
        val_fraction: f64,
    ) -> Result<Dataset> {
        let mut d = Dataset::from_tokens(packed.tokens, vocab, val_fraction)?;
        let mut mask = packed.counted;
        let val_mask = mask.split_off(d.train.len());
        d.train_mask = Some(mask);
        d.val_mask = Some(val_mask);
        Ok(d)
    }

    /// Whether some target of the data is masked (fine-tuning data with
    /// prompts that the loss does not count).
    pub fn is_masked(&self) -> bool {
        [&self.train_mask, &self.val_mask]
            .iter()
            .any(|m| m.as_ref().is_some_and(|m| m.contains(&false)))
    }

    /// The embedded Tiny Shakespeare corpus, byte-level, 10% validation.
    pub fn default_corpus() -> Dataset {
        Dataset::default_corpus_with(&Tokenizer::Byte)
    }

    /// The embedded Tiny Shakespeare corpus by `tok`, 10% validation.
    pub fn default_corpus_with(tok: &Tokenizer) -> Dataset {
        let tokens = tok.encode(DEFAULT_CORPUS);
        // Every id is below the tokenizer's vocabulary, so this cannot fail.
        Dataset::from_tokens(tokens, tok.vocab(), 0.1).unwrap_or_else(|_| unreachable!())
    }

    /// Load a text file, a directory of `.txt` files (sorted by name), or a
    /// pre-tokenized `.bin` file of little-endian u16 (or u32 with `.u32.bin`).
    /// Fine-tuning JSONL goes through [`Dataset::load_jsonl`].
    /// Text is byte-level; [`Dataset::load_with`] takes a tokenizer.
    pub fn load(path: &Path, vocab: usize, val_fraction: f64) -> Result<Dataset> {
        Dataset::load_with(path, &Tokenizer::Byte, vocab, val_fraction)
    }

    /// [`Dataset::load`] with text encoded by `tok` (token files are read as
    /// they are); every id must be below `vocab`.
    pub fn load_with(
        path: &Path,
        tok: &Tokenizer,
        vocab: usize,
        val_fraction: f64,
    ) -> Result<Dataset> {
        let io = |e: std::io::Error| Error::Data(format!("{}: {e}", path.display()));
        let name = path.to_string_lossy();
        let tokens = if path.is_dir() {
            let mut files: Vec<_> = std::fs::read_dir(path)
                .map_err(io)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "txt"))
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(Error::Data(format!(
                    "{}: no .txt files in this directory",
                    path.display()
                )));
            }
            let mut text = String::new();
            for f in files {
                text.push_str(
                    &std::fs::read_to_string(&f)
                        .map_err(|e| Error::Data(format!("{}: {e}", f.display())))?,
                );
            }
            tok.encode(&text)
        } else if name.ends_with(".u32.bin") {
            let b = std::fs::read(path).map_err(io)?;
            if b.len() % 4 != 0 {
                return Err(Error::Data(format!(
                    "{name}: {} bytes is not a whole number of u32 tokens",
                    b.len()
                )));
            }
            b.chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        } else if name.ends_with(".bin") {
            let b = std::fs::read(path).map_err(io)?;
            if b.len() % 2 != 0 {
                return Err(Error::Data(format!(
                    "{name}: {} bytes is not a whole number of u16 tokens",
                    b.len()
                )));
            }
            b.chunks_exact(2)
                .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
                .collect()
        } else {
            tok.encode(&std::fs::read_to_string(path).map_err(io)?)
        };
        tracing::debug!(
            path = %path.display(),
            tokens = tokens.len(),
            tokenizer = tok.name(),
            val_fraction,
            "dataset"
        );
        // An id past the vocabulary names the file it is in.
        Dataset::from_tokens(tokens, vocab, val_fraction).map_err(|e| match e {
            Error::Data(m) => Error::Data(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// Fine-tuning JSONL ([`crate::finetune`]) tokenized by `tok`, packed,
    /// with the mask `loss_on` gives; every id must be below `vocab`.
    pub fn load_jsonl(
        path: &Path,
        tok: &Tokenizer,
        loss_on: crate::finetune::LossOn,
        vocab: usize,
        val_fraction: f64,
    ) -> Result<Dataset> {
        let packed = crate::finetune::load_jsonl(path, tok, loss_on)?;
        Dataset::from_packed(packed, vocab, val_fraction).map_err(|e| match e {
            Error::Data(m) => Error::Data(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// A batch of `batch` windows of `seq + 1` tokens from `split`, drawn by a
    /// generator seeded with `(seed, step)`: returns inputs and targets, each
    /// `batch * seq` tokens, row-major `(B, T)`. A target the data's mask
    /// does not count is [`octet_nn::loss::IGNORE`].
    pub fn batch(
        &self,
        split: Split,
        batch: usize,
        seq: usize,
        seed: u64,
        step: u64,
    ) -> Result<(Vec<u32>, Vec<u32>)> {
        let (data, mask) = match split {
            Split::Train => (&self.train, &self.train_mask),
            Split::Val => (&self.val, &self.val_mask),
        };
        // Windows start anywhere in `0..len - seq - 1`: at least `seq + 2` tokens.
        let need = seq.saturating_add(2);
        if data.len() < need {
            return Err(Error::Data(format!(
                "the {split:?} split has {} tokens; batches of --seq {seq} need at least {need} (seq + 2); lower --seq or add data",
                data.len(),
            )));
        }
        let n = batch.checked_mul(seq).ok_or_else(|| {
            Error::Data(format!(
                "a batch of {batch} x {seq} tokens overflows {} bits",
                usize::BITS
            ))
        })?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(
            seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ split as u64,
        );
        let mut x = Vec::with_capacity(n);
        let mut y = Vec::with_capacity(n);
        for _ in 0..batch {
            let start = rng.random_range(0..data.len() - seq - 1);
            x.extend_from_slice(&data[start..start + seq]);
            match mask {
                // A masked target is IGNORE: the loss skips it.
                Some(m) => y.extend(
                    data[start + 1..start + seq + 1]
                        .iter()
                        .zip(&m[start + 1..start + seq + 1])
                        .map(|(&t, &c)| if c { t } else { octet_nn::loss::IGNORE }),
                ),
                None => y.extend_from_slice(&data[start + 1..start + seq + 1]),
            }
        }
        Ok((x, y))
    }
}

/// Which stream to draw from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Training stream.
    Train = 0,
    /// Validation stream.
    Val = 1,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_tokens_round_trip_and_name_the_vocabulary() {
        let text = &DEFAULT_CORPUS[..4000];
        let tok = Tokenizer::from_name("gpt2").unwrap();
        let ids = tok.encode(text);
        // BPE merges: several bytes a token on English text.
        assert!(ids.len() < text.len() / 3, "{} tokens", ids.len());
        assert!(ids.iter().all(|&t| (t as usize) < tok.vocab()));
        assert_eq!(tok.decode(&ids), text);
        // GPT-2's ids of a known string (its "Hello world" is 15496, 995).
        assert_eq!(tok.encode("Hello world"), vec![15496, 995]);
        // Ids past the vocabulary (the model's padding) decode to nothing.
        assert_eq!(tok.decode(&[15496, 50300, 995]), "Hello world");
        assert_eq!((tok.vocab(), tok.model_vocab()), (50257, 50304));
        assert_eq!(Tokenizer::for_vocab(50304).unwrap(), Tokenizer::Gpt2);
        assert_eq!(Tokenizer::for_vocab(256).unwrap(), Tokenizer::Byte);
        // A loss plot's unit follows the tokenizer: per byte or per BPE token.
        assert_eq!(tok.loss_label(), "cross-entropy (nats/token)");
        assert_eq!(Tokenizer::Byte.loss_label(), "cross-entropy (nats/byte)");
        assert!(Tokenizer::for_vocab(32000).is_err());
        assert!(Tokenizer::from_name("bpe").is_err());
        let byte = Tokenizer::Byte;
        assert_eq!(byte.decode(&byte.encode(text)), text);
        assert_eq!((byte.vocab(), byte.model_vocab()), (256, 256));
    }

    /// A byte-level id past 255 (a model of a larger vocabulary read with
    /// `--tokenizer byte`) shows as U+FFFD, as documented: it printed `?`,
    /// which reads as the model writing a question mark.
    #[test]
    fn byte_ids_past_255_show_as_the_replacement_character() {
        let ids = [72, 300, 105, 63];
        assert_eq!(ByteTokenizer.decode(&ids), "H\u{FFFD}i?");
        assert_eq!(Tokenizer::Byte.decode(&ids), "H\u{FFFD}i?");
        let mut s = TextStream::new(Tokenizer::Byte);
        // After an incomplete character too, streamed as the whole decode.
        let ids = [0xE2, 0x82, 70000, 0x41];
        let mut out: String = ids.iter().map(|&t| s.push(&[t])).collect();
        out.push_str(&s.finish());
        assert_eq!(out, Tokenizer::Byte.decode(&ids));
        assert_eq!(out, "\u{FFFD}\u{FFFD}A");
    }

    #[test]
    fn streamed_tokens_read_as_the_whole_decode() {
        let text = "é 日本語 🦀 naïve\u{10FFFF}";
        for tok in [Tokenizer::Byte, Tokenizer::Gpt2] {
            let ids = tok.encode(text);
            let mut s = TextStream::new(tok.clone());
            let mut out: String = ids.iter().map(|&t| s.push(&[t])).collect();
            out.push_str(&s.finish());
            assert_eq!(out, text, "{tok:?}");
        }
        // Invalid bytes read as the whole decode reads them.
        let bytes: [u8; 10] = [0x61, 0xC3, 0xE2, 0x82, 0xAC, 0xFF, 0xF0, 0x9F, 0xA6, 0xC3];
        let ids: Vec<u32> = bytes.iter().map(|&b| u32::from(b)).collect();
        let mut s = TextStream::new(Tokenizer::Byte);
        let mut out: String = ids.iter().map(|&t| s.push(&[t])).collect();
        out.push_str(&s.finish());
        assert_eq!(out, Tokenizer::Byte.decode(&ids));
    }

    #[test]
    fn batches_are_shifted_windows_and_reproducible() {
        let d = Dataset::default_corpus();
        assert!(d.train.len() > 900_000 && d.val.len() > 100_000);
        let (x, y) = d.batch(Split::Train, 3, 16, 7, 42).unwrap();
        assert_eq!((x.len(), y.len()), (48, 48));
        assert_eq!(&x[1..16], &y[..15], "targets are inputs shifted by one");
        assert_eq!(d.batch(Split::Train, 3, 16, 7, 42).unwrap(), (x.clone(), y));
        assert_ne!(d.batch(Split::Train, 3, 16, 7, 43).unwrap().0, x);
        assert_eq!(
            ByteTokenizer.decode(&ByteTokenizer.encode("First Citizen:")),
            "First Citizen:"
        );
    }

    #[test]
    fn bad_data_is_an_error() {
        assert!(Dataset::from_tokens(vec![1, 2, 300], 256, 0.1).is_err());
        let d = Dataset::from_tokens(vec![1; 10], 256, 0.1).unwrap();
        assert!(d.batch(Split::Train, 1, 16, 0, 0).is_err());
        assert!(Dataset::load(Path::new("/nonexistent/file.txt"), 256, 0.1).is_err());
    }

    #[test]
    fn a_token_past_the_vocabulary_names_its_file() {
        let p = std::env::temp_dir().join(format!("octet-vocab-{}.bin", std::process::id()));
        std::fs::write(&p, [1u8, 0, 44, 1, 2, 0]).unwrap();
        let e = Dataset::load(&p, 256, 0.1).unwrap_err().to_string();
        std::fs::remove_file(&p).unwrap();
        assert!(
            e.contains(&p.display().to_string()) && e.contains("token 300 at position 1"),
            "{e}"
        );
    }

    #[test]
    fn a_split_of_seq_plus_one_tokens_names_the_real_requirement() {
        // 17 training tokens for --seq 16: one window, but no room to draw a start.
        let d = Dataset::from_tokens(vec![1; 17], 256, 0.0).unwrap();
        let e = d.batch(Split::Train, 1, 16, 0, 0).unwrap_err().to_string();
        assert!(
            e.contains("has 17 tokens") && e.contains("need at least 18"),
            "{e}"
        );
        let d = Dataset::from_tokens(vec![1; 18], 256, 0.0).unwrap();
        assert_eq!(d.batch(Split::Train, 2, 16, 0, 0).unwrap().0.len(), 32);
        // Products that wrap are errors, not a wrapped capacity.
        assert!(d.batch(Split::Train, usize::MAX, 2, 0, 0).is_err());
        assert!(d.batch(Split::Train, 1, usize::MAX, 0, 0).is_err());
    }
}
