//! Where in a config file a key is: byte offsets to line/column, a toml
//! error's span to the key path it falls in, and a key path back to its
//! line — so every config error can say `file:line: key`.
//!
//! Invariant: total functions — any text and any offset or path give an
//! answer (the document start when nothing better is known), never a
//! panic: they run while reporting an error and must not cause another.

use toml::de::{DeTable, DeValue};

/// 1-based (line, column) of byte `offset` in `text`.
pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text.as_bytes()[..offset];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    (line, offset - line_start + 1)
}

/// The dotted key path (`tools[1].method`) whose key or value contains byte
/// `offset`: the innermost one. toml's errors carry a span but not (in
/// their public API) the key, so we find it in the spanned document.
pub(super) fn key_at(text: &str, offset: usize) -> String {
    let Ok(doc) = DeTable::parse(text) else {
        return "<document>".to_string();
    };
    let mut path = String::new();
    if !walk_table(doc.get_ref(), offset, &mut path) || path.is_empty() {
        "<document>".to_string()
    } else {
        path
    }
}

/// Depth-first: a header table's span (`[provider]`) does not cover its
/// body, so every child is searched, not only those whose span contains
/// `offset`.
fn walk_table(table: &DeTable<'_>, offset: usize, path: &mut String) -> bool {
    for (key, value) in table.iter() {
        let len = path.len();
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key.get_ref());
        // A failed walk_value leaves `path` as it found it (ending in `key`).
        if key.span().contains(&offset)
            || walk_value(value.get_ref(), offset, path)
            || value.span().contains(&offset)
        {
            return true;
        }
        path.truncate(len);
    }
    false
}

fn walk_value(value: &DeValue<'_>, offset: usize, path: &mut String) -> bool {
    match value {
        DeValue::Table(t) => walk_table(t, offset, path),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                if walk_value(item.get_ref(), offset, path) || item.span().contains(&offset) {
                    return true;
                }
                path.truncate(len);
            }
            false
        }
        _ => false,
    }
}

/// The 1-based line of `key_path` (`tools[1].method`) in `text`: of the
/// deepest part of the path present in the file (a defaulted key is not in
/// the file, so its table's line is the best place to point at).
pub(super) fn line_of_key(text: &str, key_path: &str) -> usize {
    let Ok(doc) = DeTable::parse(text) else {
        return 1;
    };
    let mut span = doc.span();
    let mut current: Option<&DeValue<'_>> = None;
    let mut table: &DeTable<'_> = doc.get_ref();
    for part in key_path.split('.') {
        let (name, index) = match part.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        if let Some(DeValue::Table(t)) = current {
            table = t;
        } else if current.is_some() {
            break;
        }
        let Some((key, value)) = table.iter().find(|(k, _)| k.get_ref() == name) else {
            break;
        };
        span = key.span();
        current = Some(value.get_ref());
        if let (Some(i), DeValue::Array(items)) = (index, value.get_ref()) {
            match items.get(i) {
                Some(item) => {
                    span = item.span();
                    current = Some(item.get_ref());
                }
                None => break,
            }
        }
    }
    line_col(text, span.start).0
}

/// Entry `index` of the array of tables `array` (`[[tools]]`), alone:
/// `text` with every byte outside that entry's keys and values blanked
/// (newlines kept, so offsets, lines and columns stay the file's), its
/// `tag` key blanked too, and that tag's value. For the error of an
/// internally tagged entry, which serde reports at the entry's header:
/// deserializing the blanked text as the tag's own type points at the
/// key. `None` if the entry is not a table or has no string tag.
pub(super) fn entry_alone(text: &str, array: &str, index: usize, tag: &str) -> Option<(String, String)> {
    let doc = DeTable::parse(text).ok()?;
    let (_, items) = doc.get_ref().iter().find(|(k, _)| k.get_ref() == array)?;
    let DeValue::Array(items) = items.get_ref() else {
        return None;
    };
    let DeValue::Table(entry) = items.get(index)?.get_ref() else {
        return None;
    };
    let mut kept = Vec::new();
    let mut kind = None;
    for (key, value) in entry.iter() {
        let span = key.span().start..value.span().end;
        match (key.get_ref() == tag, value.get_ref()) {
            (true, DeValue::String(s)) => kind = Some(s.to_string()),
            (true, _) => return None,
            (false, _) => kept.push(span),
        }
    }
    let mut bytes = text.as_bytes().to_vec();
    for (i, b) in bytes.iter_mut().enumerate() {
        if *b != b'\n' && !kept.iter().any(|r| r.contains(&i)) {
            *b = b' ';
        }
    }
    // Whole UTF-8 sequences are kept or blanked (spans are char
    // boundaries), so this cannot fail; None rather than a panic if so.
    Some((String::from_utf8(bytes).ok()?, kind?))
}
