//! Fuzzy filtering of the root picker's function list (100,000+ names) with nucleo-matcher.
//!
//! The one idea: a fuzzy query that grows by a character can only match a subset of what
//! the shorter query matched, so each keystroke re-scores only the previous matches, and
//! the results of every shorter query are kept so Backspace costs nothing.

use nucleo_matcher::pattern::{AtomKind, CaseMatching, Normalization, Pattern};
use nucleo_matcher::{Config, Matcher, Utf32Str};

use crate::model::FunctionEntry;

/// Incremental fuzzy filter over function names.
pub struct FunctionFilter {
    matcher: Matcher,
    /// Results of the current query and of each of its prefixes typed before it, oldest
    /// first; an empty stack means "no query: everything matches, in list order".
    levels: Vec<Level>,
    all: Vec<u32>,
}

struct Level {
    query: String,
    matches: Vec<u32>,
}

impl std::fmt::Debug for FunctionFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FunctionFilter")
            .field("query", &self.query())
            .field("matches", &self.matches().len())
            .finish()
    }
}

impl Default for FunctionFilter {
    fn default() -> Self {
        let mut config = Config::DEFAULT;
        config.prefer_prefix = true;
        FunctionFilter {
            matcher: Matcher::new(config),
            levels: Vec::new(),
            all: Vec::new(),
        }
    }
}

impl FunctionFilter {
    /// Starts over on a new function list with an empty query.
    pub fn reset(&mut self, functions: &[FunctionEntry]) {
        self.levels.clear();
        self.all = (0..functions.len() as u32).collect();
    }

    pub fn query(&self) -> &str {
        self.levels.last().map_or("", |level| &level.query)
    }

    /// Indices into the function list of the matches, best first.
    pub fn matches(&self) -> &[u32] {
        self.levels.last().map_or(&self.all, |level| &level.matches)
    }

    /// Filters `functions` by `query`, reusing the results of any earlier prefix of it.
    pub fn set_query(&mut self, query: &str, functions: &[FunctionEntry]) {
        while let Some(level) = self.levels.last() {
            // A backslash escapes whitespace in nucleo patterns, so a longer query is
            // not necessarily narrower: start over from the full list then.
            if query.starts_with(level.query.as_str()) && !query.contains('\\') {
                break;
            }
            self.levels.pop();
        }
        if self.query() == query {
            return;
        }
        if query.trim().is_empty() {
            self.levels.clear();
            return;
        }
        let pattern = Pattern::new(
            query,
            CaseMatching::Smart,
            Normalization::Smart,
            AtomKind::Fuzzy,
        );
        let FunctionFilter {
            matcher,
            levels,
            all,
        } = self;
        let candidates = levels
            .last()
            .map_or(all.as_slice(), |level| level.matches.as_slice());
        let mut buffer = Vec::new();
        let mut scored: Vec<(u32, u32)> = Vec::with_capacity(candidates.len().min(4096));
        for &index in candidates {
            let name = &functions[index as usize].name;
            if let Some(score) = pattern.score(Utf32Str::new(name, &mut buffer), matcher) {
                scored.push((index, score));
            }
        }
        scored.sort_unstable_by(|&(a, score_a), &(b, score_b)| {
            score_b
                .cmp(&score_a)
                .then_with(|| {
                    functions[a as usize]
                        .name
                        .len()
                        .cmp(&functions[b as usize].name.len())
                })
                .then_with(|| a.cmp(&b))
        });
        let matches = scored.into_iter().map(|(index, _)| index).collect();
        levels.push(Level {
            query: query.to_string(),
            matches,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn functions(names: &[&str]) -> Vec<FunctionEntry> {
        names
            .iter()
            .map(|name| FunctionEntry {
                name: name.to_string(),
                module: "m".into(),
                size: 1,
                address: 0,
            })
            .collect()
    }

    fn matched<'a>(filter: &FunctionFilter, functions: &'a [FunctionEntry]) -> Vec<&'a str> {
        filter
            .matches()
            .iter()
            .map(|&index| functions[index as usize].name.as_str())
            .collect()
    }

    #[test]
    fn typing_narrows_and_backspace_restores() {
        let list = functions(&["compute_block", "copy_bytes", "main", "cmp_blocks"]);
        let mut filter = FunctionFilter::default();
        filter.reset(&list);
        assert_eq!(filter.matches().len(), 4);
        filter.set_query("c", &list);
        filter.set_query("cb", &list);
        assert_eq!(matched(&filter, &list).len(), 3);
        filter.set_query("cblk", &list);
        let mut narrowed = matched(&filter, &list);
        narrowed.sort();
        assert_eq!(narrowed, ["cmp_blocks", "compute_block"]);
        filter.set_query("cb", &list);
        assert_eq!(matched(&filter, &list).len(), 3);
        filter.set_query("", &list);
        assert_eq!(filter.matches().len(), 4);
        filter.set_query("zzz", &list);
        assert!(filter.matches().is_empty());
    }

    #[test]
    fn uppercase_makes_the_query_case_sensitive() {
        let list = functions(&["Render", "render"]);
        let mut filter = FunctionFilter::default();
        filter.reset(&list);
        filter.set_query("ren", &list);
        assert_eq!(filter.matches().len(), 2);
        filter.set_query("Ren", &list);
        assert_eq!(matched(&filter, &list), ["Render"]);
    }
}
