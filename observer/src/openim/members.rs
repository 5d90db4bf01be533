//! Describes how OpenIM's two routing components spell the same gateway, and what separates two
//! spellings, in plain words.

/// Says whether the proxy's and push's rings still split users, as a `ring_divergence` line says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RingDivergenceState {
    /// The rings split users (the incident's first line).
    Diverged,
    /// The rings agree again after a reported divergence (its last line).
    Resolved,
}

/// Says in plain words what separates two spellings of the same gateway, given one member of
/// the proxy ring and the matching member of the push ring.
///
/// An insertion reads "push members carry ':88', proxy members do not"; a substitution names
/// whole words ("proxy members carry '80' where push members carry '88'"); spellings with
/// nothing in common are quoted in full.
pub fn describe_member_difference(proxy: &str, push: &str) -> String {
    if proxy == push {
        return format!("proxy and push spell a gateway the same way ('{proxy}')");
    }
    let prefix_len = common_prefix_len(proxy, push);
    let suffix_len = common_suffix_len(&proxy[prefix_len..], &push[prefix_len..]);
    if prefix_len == 0 && suffix_len == 0 {
        return format!("proxy spells the same gateway as '{proxy}', push as '{push}'");
    }
    let proxy_part = &proxy[prefix_len..proxy.len() - suffix_len];
    let push_part = &push[prefix_len..push.len() - suffix_len];
    if proxy_part.is_empty() {
        return format!("push members carry '{push_part}', proxy members do not");
    }
    if push_part.is_empty() {
        return format!("proxy members carry '{proxy_part}', push members do not");
    }
    // A substitution cut at the first differing character can split a word ('0' vs '8' out of
    // ':80' vs ':88'); widening to whole alphanumeric words reads better.
    let start = word_start(proxy, prefix_len);
    let proxy_end = word_end(proxy, proxy.len() - suffix_len);
    let push_end = word_end(push, push.len() - suffix_len);
    format!(
        "proxy members carry '{}' where push members carry '{}'",
        &proxy[start..proxy_end],
        &push[start..push_end]
    )
}

/// Returns the byte length of the longest common prefix, on a character boundary of both.
fn common_prefix_len(left: &str, right: &str) -> usize {
    left.chars()
        .zip(right.chars())
        .take_while(|(left, right)| left == right)
        .map(|(same, _)| same.len_utf8())
        .sum()
}

/// Returns the byte length of the longest common suffix, on a character boundary of both.
fn common_suffix_len(left: &str, right: &str) -> usize {
    left.chars()
        .rev()
        .zip(right.chars().rev())
        .take_while(|(left, right)| left == right)
        .map(|(same, _)| same.len_utf8())
        .sum()
}

/// Moves `at` back to the start of the alphanumeric word it falls inside.
fn word_start(text: &str, at: usize) -> usize {
    let word_before = text[..at]
        .chars()
        .rev()
        .take_while(|c| c.is_alphanumeric())
        .map(char::len_utf8)
        .sum::<usize>();
    if text[at..].starts_with(char::is_alphanumeric) {
        at - word_before
    } else {
        at
    }
}

/// Moves `at` forward to the end of the alphanumeric word it falls inside.
fn word_end(text: &str, at: usize) -> usize {
    let word_after = text[at..]
        .chars()
        .take_while(|c| c.is_alphanumeric())
        .map(char::len_utf8)
        .sum::<usize>();
    if text[..at].ends_with(char::is_alphanumeric) {
        at + word_after
    } else {
        at
    }
}

#[cfg(test)]
mod tests;
