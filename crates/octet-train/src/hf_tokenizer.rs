//! A Hugging Face model folder's tokenizer: `tokenizer.json` through
//! Hugging Face's own `tokenizers` crate, its special tokens, and its chat
//! template rendered as transformers renders it.
//!
//! | file                     | what is read                                        |
//! |--------------------------|-----------------------------------------------------|
//! | `tokenizer.json`         | the tokenizer (required)                            |
//! | `tokenizer_config.json`  | `bos_token`, `eos_token` (and `unk`/`pad` for the   |
//! |                          | template), as strings or `{"content": ...}`;        |
//! |                          | `chat_template` (a string, or a list of named ones: |
//! |                          | `default` is taken)                                 |
//! | `chat_template.jinja`    | the chat template, over `tokenizer_config.json`'s   |
//! | `generation_config.json` | `bos_token_id`, `eos_token_id` (an id or a list)    |
//!
//! The chat template runs as transformers runs it (`apply_chat_template`):
//! Jinja with `trim_blocks` and `lstrip_blocks`, loop controls, the
//! variables `messages`, `add_generation_prompt`, `tools` and `documents`
//! (none) and the special tokens (`bos_token`, `eos_token`, ...), the
//! functions `raise_exception(msg)`, and `tojson` writing Python's
//! `json.dumps(..., ensure_ascii=False)`. Python's string methods
//! (`.strip()`, `.startswith()`, ...) come from `minijinja-contrib`.

use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// A token's bytes in the text it was read from: `(start, end)`.
pub type ByteRange = (usize, usize);

/// A special token: its text and its id in the vocabulary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialToken {
    /// The token's text (`<s>`, `<|endoftext|>`, ...).
    pub text: String,
    /// Its id.
    pub id: u32,
}

/// A chat template and the file it came from (errors name it).
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    /// The Jinja source.
    pub source: String,
    /// `tokenizer_config.json` or `chat_template.jinja`.
    pub file: PathBuf,
}

/// A `tokenizer.json` tokenizer with its folder's special tokens and chat
/// template (see the module docs).
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    /// The `tokenizer.json` read.
    path: PathBuf,
    /// `path` as text, for messages.
    name: String,
    /// One past the largest id (added tokens included).
    vocab: usize,
    /// The beginning-of-sequence token, where the folder names one.
    pub bos: Option<SpecialToken>,
    /// The end-of-sequence token of `tokenizer_config.json`, where named.
    pub eos: Option<SpecialToken>,
    /// Every id that ends a generation: `eos`'s and `generation_config.json`'s.
    pub eos_ids: Vec<u32>,
    /// Special tokens passed to the chat template by name (`bos_token`, ...).
    template_tokens: Vec<(String, String)>,
    /// The chat template, where the folder has one.
    pub chat_template: Option<ChatTemplate>,
    /// The template compiled at its first use (a broken one is an error of
    /// what renders with it, not of loading the tokenizer).
    compiled: OnceLock<std::result::Result<minijinja::Environment<'static>, String>>,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("path", &self.path)
            .field("vocab", &self.vocab)
            .field("bos", &self.bos)
            .field("eos_ids", &self.eos_ids)
            .finish_non_exhaustive()
    }
}

/// The `tokenizer.json` a path names: the file itself, or the one in a folder.
pub fn tokenizer_json(path: &Path) -> Option<PathBuf> {
    if path.is_dir() {
        let p = path.join("tokenizer.json");
        return p.is_file().then_some(p);
    }
    path.is_file().then(|| path.to_path_buf())
}

/// A JSON file of the tokenizer's folder: `None` where it is absent; an
/// error naming it where it is not JSON.
fn read_json(path: &Path) -> Result<Option<serde_json::Value>> {
    let text = match std::fs::read_to_string(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::file("reading", path)(e)),
        Ok(t) => t,
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::Data(format!("{}: not valid JSON ({e})", path.display())))
}

/// A special token entry of `tokenizer_config.json`: a string, or an object
/// with its `content` (an `AddedToken`).
fn token_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(String::from),
        _ => None,
    }
}

/// Ids of `generation_config.json`'s `key`: an integer or a list of them.
fn ids_of(v: &serde_json::Value, key: &str, file: &Path) -> Result<Vec<u32>> {
    let bad = || {
        Error::Data(format!(
            "{}: {key} = {}: expected a token id or a list of them",
            file.display(),
            v[key]
        ))
    };
    let one = |x: &serde_json::Value| x.as_u64().and_then(|i| u32::try_from(i).ok());
    match &v[key] {
        serde_json::Value::Null => Ok(Vec::new()),
        serde_json::Value::Array(a) => a.iter().map(|x| one(x).ok_or_else(bad)).collect(),
        x => Ok(vec![one(x).ok_or_else(bad)?]),
    }
}

impl HfTokenizer {
    /// Load `tokenizer.json` (`path`: the file, or a folder holding it) and,
    /// from the same folder, its special tokens and chat template. Loaded
    /// once per process while the files are unchanged (a large vocabulary
    /// takes a while to read, and a run asks for its tokenizer often).
    pub fn load(path: &Path) -> Result<Arc<HfTokenizer>> {
        /// The `tokenizer.json` and its folder's files' modification times.
        type Key = (PathBuf, Vec<Option<std::time::SystemTime>>);
        type Loaded = Mutex<Vec<(Key, Arc<HfTokenizer>)>>;
        static LOADED: OnceLock<Loaded> = OnceLock::new();
        let json = tokenizer_json(path).ok_or_else(|| {
            Error::Data(format!(
                "{}: no tokenizer.json (give the file or a model folder holding one)",
                path.display()
            ))
        })?;
        let key = std::fs::canonicalize(&json).unwrap_or_else(|_| json.clone());
        let dir = key.parent().unwrap_or(Path::new(".")).to_path_buf();
        let stamps = [
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
            "generation_config.json",
        ]
        .iter()
        .map(|f| {
            std::fs::metadata(dir.join(f))
                .and_then(|m| m.modified())
                .ok()
        })
        .collect();
        let key = (key, stamps);
        let cache = LOADED.get_or_init(|| Mutex::new(Vec::new()));
        if let Some((_, t)) = cache
            .lock()
            .map_err(|_| Error::Data("tokenizer cache poisoned".into()))?
            .iter()
            .find(|(p, _)| *p == key)
        {
            return Ok(t.clone());
        }
        let tok = Arc::new(HfTokenizer::read(&json)?);
        if let Ok(mut c) = cache.lock() {
            c.push((key, tok.clone()));
        }
        Ok(tok)
    }

    /// Read the tokenizer at `json` and its folder's configuration.
    fn read(json: &Path) -> Result<HfTokenizer> {
        let inner = tokenizers::Tokenizer::from_file(json)
            .map_err(|e| Error::Data(format!("{}: {e}", json.display())))?;
        let dir = json.parent().unwrap_or(Path::new("."));
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = read_json(&cfg_path)?.unwrap_or(serde_json::Value::Null);
        let gen_path = dir.join("generation_config.json");
        let gen = read_json(&gen_path)?.unwrap_or(serde_json::Value::Null);
        let vocab = inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&m| m as usize + 1);
        let special = |key: &str| -> Result<Option<SpecialToken>> {
            let Some(text) = token_text(&cfg[key]) else {
                return Ok(None);
            };
            let id = inner.token_to_id(&text).ok_or_else(|| {
                Error::Data(format!(
                    "{}: {key} {text:?} is not a token of {}",
                    cfg_path.display(),
                    json.display()
                ))
            })?;
            Ok(Some(SpecialToken { text, id }))
        };
        let (bos, eos) = (special("bos_token")?, special("eos_token")?);
        let mut eos_ids: Vec<u32> = eos.iter().map(|t| t.id).collect();
        for id in ids_of(&gen, "eos_token_id", &gen_path)? {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let bos = match (bos, ids_of(&gen, "bos_token_id", &gen_path)?.first()) {
            (Some(b), _) => Some(b),
            (None, Some(&id)) => inner.id_to_token(id).map(|text| SpecialToken { text, id }),
            (None, None) => None,
        };
        let template_tokens = ["bos_token", "eos_token", "unk_token", "pad_token"]
            .iter()
            .filter_map(|k| token_text(&cfg[*k]).map(|t| (k.to_string(), t)))
            .collect();
        let chat_template = Self::read_template(dir, &cfg, &cfg_path)?;
        Ok(HfTokenizer {
            inner,
            path: json.to_path_buf(),
            name: json.display().to_string(),
            vocab,
            bos,
            eos,
            eos_ids,
            template_tokens,
            chat_template,
            compiled: OnceLock::new(),
        })
    }

    /// The chat template: `chat_template.jinja` where there is one (as
    /// transformers saves it now), else `tokenizer_config.json`'s
    /// `chat_template` (a string, or a list of `{name, template}` of which
    /// `default` is taken).
    fn read_template(
        dir: &Path,
        cfg: &serde_json::Value,
        cfg_path: &Path,
    ) -> Result<Option<ChatTemplate>> {
        let jinja = dir.join("chat_template.jinja");
        if jinja.is_file() {
            let source = std::fs::read_to_string(&jinja).map_err(Error::file("reading", &jinja))?;
            return Ok(Some(ChatTemplate {
                source,
                file: jinja,
            }));
        }
        let source = match &cfg["chat_template"] {
            serde_json::Value::Null => return Ok(None),
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(list) => list
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .map(String::from)
                .ok_or_else(|| {
                    Error::Data(format!(
                        "{}: chat_template is a list with no template named \"default\"",
                        cfg_path.display()
                    ))
                })?,
            other => {
                return Err(Error::Data(format!(
                    "{}: chat_template is {other}: expected a string",
                    cfg_path.display()
                )))
            }
        };
        Ok(Some(ChatTemplate {
            source,
            file: cfg_path.to_path_buf(),
        }))
    }

    /// The `tokenizer.json` path, as text.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One past the largest token id (added tokens included).
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Token ids of `text`; `special`: with the special tokens the
    /// tokenizer's post-processor adds (a BOS, say), as `tokenizer(text)`
    /// does in transformers. Special tokens written in the text are read as
    /// those tokens either way.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        Ok(self.encode_offsets(text, special)?.0)
    }

    /// [`HfTokenizer::encode`] with each token's byte range in `text`.
    pub fn encode_offsets(&self, text: &str, special: bool) -> Result<(Vec<u32>, Vec<ByteRange>)> {
        let e = self
            .inner
            .encode(text, special)
            .map_err(|e| Error::Data(format!("{}: encoding: {e}", self.name)))?;
        Ok((e.get_ids().to_vec(), e.get_offsets().to_vec()))
    }

    /// Text of token ids, special tokens left out (Python's `decode`
    /// default); ids past the vocabulary are left out too.
    pub fn decode(&self, ids: &[u32]) -> String {
        let known: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&t| (t as usize) < self.vocab)
            .collect();
        self.inner.decode(&known, true).unwrap_or_default()
    }

    /// [`HfTokenizer::render_chat`] of messages given as JSON text (a list
    /// of `{role, content}`), their keys kept in order as Python keeps them.
    pub fn render_chat_json(&self, messages: &str, add_generation_prompt: bool) -> Result<String> {
        let list: Vec<minijinja::Value> =
            serde_json::from_str(messages).map_err(|e| Error::Data(format!("messages: {e}")))?;
        self.render_chat(&list, add_generation_prompt)
    }

    /// Render `messages` (`{role, content}` maps) with the chat template, as
    /// transformers' `apply_chat_template(..., tokenize=False)`. Errors (no
    /// template, one that does not parse, a `raise_exception`) name the
    /// template's file.
    pub fn render_chat(
        &self,
        messages: &[minijinja::Value],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let t = self.chat_template.as_ref().ok_or_else(|| {
            Error::Data(format!(
                "{} has no chat template (tokenizer_config.json's chat_template or \
                 chat_template.jinja) to render messages with",
                self.path.parent().unwrap_or(Path::new(".")).display()
            ))
        })?;
        let bad = |e: &dyn std::fmt::Display| {
            Error::Data(format!("chat template of {}: {e:#}", t.file.display()))
        };
        let env = self
            .compiled
            .get_or_init(|| {
                let mut env = template_env();
                env.add_template_owned("chat", t.source.clone())
                    .map(|()| env)
                    .map_err(|e| format!("{e:#}"))
            })
            .as_ref()
            .map_err(|e| bad(e))?;
        let tmpl = env.get_template("chat").map_err(|e| bad(&e))?;
        use minijinja::Value;
        let mut ctx: std::collections::BTreeMap<String, Value> = self
            .template_tokens
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        ctx.insert("messages".into(), Value::from(messages.to_vec()));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        // transformers passes them as None: `tools is not none` is false.
        ctx.insert("tools".into(), Value::from(()));
        ctx.insert("documents".into(), Value::from(()));
        tmpl.render(Value::from(ctx)).map_err(|e| bad(&e))
    }
}

/// The Jinja environment transformers renders chat templates in (see the
/// module docs).
fn template_env() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build();
    if let Ok(s) = syntax {
        env.set_syntax(s);
    }
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<minijinja::Value, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                format!("raise_exception: {msg}"),
            ))
        },
    );
    env.add_filter("tojson", tojson);
    env
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`, as
/// transformers' `tojson` filter writes it (`, ` and `: ` between items
/// without an indent; no HTML escaping, unlike minijinja's own `tojson`).
fn tojson(
    value: minijinja::Value,
    kwargs: minijinja::value::Kwargs,
) -> std::result::Result<minijinja::Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value).map_err(|e| {
        minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
    })?;
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let f = serde_json::ser::PrettyFormatter::with_indent(&pad);
            serde::Serialize::serialize(
                &json,
                &mut serde_json::Serializer::with_formatter(&mut out, f),
            )
        }
        None => serde::Serialize::serialize(
            &json,
            &mut serde_json::Serializer::with_formatter(&mut out, PythonFormatter),
        ),
    };
    written.map_err(|e| {
        minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
    })?;
    let text = String::from_utf8(out).map_err(|e| {
        minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
    })?;
    Ok(minijinja::Value::from_safe_string(text))
}

/// JSON with Python's default separators: `, ` between items, `: ` after keys.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}
