//! The `__global__` names of a kernel source, read from its text
//! ([`crate::kernel_names`]): comments removed, continued lines joined, the
//! function-like macros that define kernels expanded where they are used.

use std::collections::HashMap;

/// A function-like macro: its parameters and its body.
struct Macro {
    params: Vec<String>,
    body: String,
}

pub(crate) fn names(src: &str) -> Vec<String> {
    let text = strip_comments(src).replace("\\\n", " ");
    let mut macros: HashMap<String, Macro> = HashMap::new();
    let mut top = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix('#') {
            if let Some(def) = rest.trim_start().strip_prefix("define") {
                if let Some((name, m)) = function_macro(def) {
                    macros.insert(name, m);
                }
            }
            continue;
        }
        top.push_str(line);
        top.push('\n');
    }
    // The macros that define a kernel, directly or through another one.
    let mut kernel_macros: Vec<String> = macros
        .iter()
        .filter(|(_, m)| has_token(&m.body, "__global__"))
        .map(|(n, _)| n.clone())
        .collect();
    loop {
        let more: Vec<String> = macros
            .iter()
            .filter(|(n, m)| {
                !kernel_macros.contains(n) && kernel_macros.iter().any(|k| has_token(&m.body, k))
            })
            .map(|(n, _)| n.clone())
            .collect();
        if more.is_empty() {
            break;
        }
        kernel_macros.extend(more);
    }
    let expanded = expand(&top, &macros, &kernel_macros, 0);
    globals(&expanded)
}

/// `src` without `//` and `/* */` comments (string and character literals kept).
fn strip_comments(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    if b[i] == b'\n' {
                        out.push(b'\n');
                    }
                    i += 1;
                }
                i += 2;
                out.push(b' ');
            }
            q @ (b'"' | b'\'') => {
                out.push(q);
                i += 1;
                while i < b.len() && b[i] != q {
                    if b[i] == b'\\' && i + 1 < b.len() {
                        out.push(b[i]);
                        i += 1;
                    }
                    out.push(b[i]);
                    i += 1;
                }
                if i < b.len() {
                    out.push(q);
                    i += 1;
                }
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The identifiers of `s` with their byte offsets.
fn idents(s: &str) -> Vec<(usize, &str)> {
    let mut v = Vec::new();
    let mut start = None;
    for (i, c) in s.char_indices().chain(std::iter::once((s.len(), ' '))) {
        match (start, is_ident(c)) {
            (None, true) => start = Some(i),
            (Some(st), false) => {
                let w = &s[st..i];
                if !w.starts_with(|c: char| c.is_ascii_digit()) {
                    v.push((st, w));
                }
                start = None;
            }
            _ => {}
        }
    }
    v
}

fn has_token(s: &str, tok: &str) -> bool {
    idents(s).iter().any(|(_, w)| *w == tok)
}

/// `NAME(params) body` after `#define`, when the macro is function-like.
fn function_macro(def: &str) -> Option<(String, Macro)> {
    let def = def.trim_start();
    let end = def.find(|c: char| !is_ident(c))?;
    let (name, rest) = def.split_at(end);
    let rest = rest.strip_prefix('(')?; // no space: function-like
    let close = rest.find(')')?;
    let params = rest[..close]
        .split(',')
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect();
    let body = rest[close + 1..].to_string();
    Some((name.to_string(), Macro { params, body }))
}

/// The arguments of a use whose `(` is at `s[open]`, and the offset past its `)`.
fn arguments(s: &str, open: usize) -> Option<(Vec<String>, usize)> {
    let mut depth = 0;
    let mut args = Vec::new();
    let mut start = open + 1;
    for (i, c) in s[open..].char_indices().map(|(i, c)| (open + i, c)) {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    args.push(s[start..i].trim().to_string());
                    return Some((args, i + 1));
                }
            }
            ',' if depth == 1 => {
                args.push(s[start..i].trim().to_string());
                start = i + 1;
            }
            _ => {}
        }
    }
    None
}

/// `s` with every use of a kernel macro replaced by its body (parameters
/// substituted, `##` pasted), again inside what that yields.
fn expand(
    s: &str,
    macros: &HashMap<String, Macro>,
    kernel_macros: &[String],
    depth: usize,
) -> String {
    if depth > 16 {
        return s.to_string();
    }
    let mut out = String::new();
    let mut at = 0;
    for (pos, w) in idents(s) {
        if pos < at || !kernel_macros.iter().any(|k| k == w) {
            continue;
        }
        let after = pos + w.len();
        let open = match s[after..].find(|c: char| !c.is_whitespace()) {
            Some(o) if s[after + o..].starts_with('(') => after + o,
            _ => continue,
        };
        let Some((args, end)) = arguments(s, open) else {
            continue;
        };
        let m = &macros[w];
        let mut body = String::new();
        let mut last = 0;
        for (bpos, bw) in idents(&m.body) {
            if let Some(k) = m.params.iter().position(|p| p == bw) {
                body.push_str(&m.body[last..bpos]);
                body.push_str(args.get(k).map_or("", String::as_str));
                last = bpos + bw.len();
            }
        }
        body.push_str(&m.body[last..]);
        let pasted = paste(&body);
        out.push_str(&s[at..pos]);
        out.push_str(&expand(&pasted, macros, kernel_macros, depth + 1));
        out.push('\n');
        at = end;
    }
    out.push_str(&s[at..]);
    out
}

/// `a ## b` as `ab`.
fn paste(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("##") {
        out.push_str(rest[..i].trim_end());
        rest = rest[i + 2..].trim_start();
    }
    out.push_str(rest);
    out
}

/// The name after each `__global__` of `s`: past `void` and
/// `__launch_bounds__(..)`, the identifier in front of `(`.
fn globals(s: &str) -> Vec<String> {
    let words = idents(s);
    let mut names = Vec::new();
    for (k, &(_, w)) in words.iter().enumerate() {
        if w != "__global__" {
            continue;
        }
        let mut j = k + 1;
        while let Some(&(pos, w)) = words.get(j) {
            if w == "__launch_bounds__" {
                // Skip past its parenthesized arguments.
                let close = s[pos..].find(')').map_or(s.len(), |c| pos + c);
                while words.get(j).is_some_and(|&(p, _)| p < close) {
                    j += 1;
                }
                continue;
            }
            let after = s[pos + w.len()..].trim_start();
            if after.starts_with('(') {
                names.push(w.to_string());
                break;
            }
            j += 1;
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::names;

    #[test]
    fn written_out_and_macro_made_kernels_are_found() {
        let src = r#"
// extern "C" __global__ void commented_out(int x) {}
/* __global__ void also_commented() {} */
extern "C" __global__ void plain(const float* x, "not // a comment") {}
extern "C" __global__ void __launch_bounds__(256, 2) bounded(int n) {}
#define ONE(NAME, V) \
    extern "C" __global__ void NAME(int n) { f<V>(n); }
ONE(made_a, 1)
ONE(made_b, 4)
#define SUF(V, S) extern "C" __global__ void __launch_bounds__(V) k##S(int) {}
SUF(1, )
SUF(4, _v4)
#define INNER(D, W) extern "C" __global__ void in##D##_##W() {}
#define OUTER(D) \
    extern "C" __global__ void out##D() {} \
    INNER(D, 1)
#if defined(SOMETHING)
OUTER(64)
#endif
__device__ void helper() {}
"#;
        assert_eq!(
            names(src),
            ["plain", "bounded", "made_a", "made_b", "k", "k_v4", "out64", "in64_1"]
        );
    }
}
