//! The patterns of `.../reload` lists, compiled once and kept within a memory budget.
//!
//! Reloader compiles each entry as `^entry$`. Most entries are names: those match as text,
//! with no automaton at all (a dot matches any character, as in the regex). Real regular
//! expressions are compiled with a size limit each, and kept with their search cache in a
//! least-recently-used cache of [`BUDGET`] bytes, counted from what the engine reports; a list
//! is read up to [`PER_LIST`] of them. So no workload's annotation, however long or clever, can
//! take the controller's memory, as one annotation of short, expensive entries like `\pL{10}a0`
//! did before (issue 49; docs/security.md).

use std::collections::HashMap;

use regex_automata::Input;
use regex_automata::meta::{Cache, Regex};

/// Compiled size one entry may reach (the regex crate's default is 10 MiB).
const PATTERN_SIZE_LIMIT: usize = 256 << 10;
/// The most one entry's lazy DFA may hold while it matches (the engine's default is 2 MiB).
const SEARCH_CACHE: usize = 256 << 10;
/// Bytes of compiled patterns and their caches kept at once; the least recently used go first.
pub const BUDGET: usize = 32 << 20;
/// Regular expressions read of one list (names are not counted): beyond, the entries are
/// reported and skipped, so one change never compiles more than this.
pub const PER_LIST: usize = 64;

/// An entry as it matches.
#[derive(Debug)]
enum Matcher {
    /// Letters, digits, `-` and `_`: the regex `^entry$` is the text itself.
    Exact(Box<str>),
    /// As above with dots, each matching any one character.
    Dotted(Box<str>),
    Regex(Box<(Regex, Cache)>),
}

/// Letters, digits, `-` and `_`: a name, whose regex is the text itself.
fn is_plain(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// A name, dots allowed: matched without an automaton.
fn is_name(entry: &str) -> bool {
    entry.chars().all(|c| is_plain(c) || c == '.')
}

impl Matcher {
    fn of(entry: &str) -> Result<Matcher, String> {
        if entry.chars().all(is_plain) {
            return Ok(Matcher::Exact(entry.into()));
        }
        if is_name(entry) {
            return Ok(Matcher::Dotted(entry.into()));
        }
        let config = Regex::config()
            .nfa_size_limit(Some(PATTERN_SIZE_LIMIT))
            .onepass_size_limit(Some(PATTERN_SIZE_LIMIT))
            .dfa_size_limit(Some(PATTERN_SIZE_LIMIT))
            .hybrid_cache_capacity(SEARCH_CACHE);
        let regex = Regex::builder()
            .configure(config)
            .build(&format!("^{entry}$"))
            .map_err(|err| crate::reload::api::causes(&err))?;
        let cache = regex.create_cache();
        Ok(Matcher::Regex(Box::new((regex, cache))))
    }

    fn is_match(&mut self, name: &str) -> bool {
        match self {
            Matcher::Exact(text) => **text == *name,
            Matcher::Dotted(text) => {
                text.len() == name.len() && text.bytes().zip(name.bytes()).all(|(p, n)| p == b'.' || p == n)
            }
            Matcher::Regex(compiled) => {
                let (regex, cache) = &mut **compiled;
                regex.is_match_with(cache, &Input::new(name))
            }
        }
    }

    /// Heap bytes held, as the engine counts them (its cache as it has grown).
    fn bytes(&self, entry: &str) -> usize {
        let compiled = match self {
            Matcher::Regex(compiled) => compiled.0.memory_usage() + compiled.1.memory_usage(),
            _ => entry.len(),
        };
        compiled + entry.len() + 64
    }
}

#[derive(Debug)]
struct Kept {
    matcher: Result<Matcher, String>,
    bytes: usize,
    used: u64,
}

/// Compiled entries, least recently used first out past [`BUDGET`].
#[derive(Debug, Default)]
pub struct Patterns {
    kept: HashMap<Box<str>, Kept>,
    bytes: usize,
    clock: u64,
}

/// Why an entry was not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not a valid regular expression (or past its size limit): the engine's message.
    Invalid(String),
    /// Past the [`PER_LIST`] regular expressions of its list.
    TooMany,
}

impl Patterns {
    /// Whether the entries of `list` (split at commas, trimmed) match `name`; `refused` hears
    /// of each entry that cannot be read. Names cost nothing; regular expressions count
    /// against [`PER_LIST`].
    pub fn any_matches(&mut self, list: &str, name: &str, mut refused: impl FnMut(&str, Refused)) -> bool {
        let mut regexes = 0;
        for entry in list.split(',').map(str::trim) {
            match self.check(entry, &mut regexes) {
                Err(why) => refused(entry, why),
                Ok(()) => {
                    if self.matches(entry, name) {
                        return true;
                    }
                }
            }
        }
        false
    }

    /// Every entry of `list` that cannot be read, and why (the annotation lint).
    pub fn refused<'a>(&mut self, list: &'a str) -> Vec<(&'a str, Refused)> {
        let mut regexes = 0;
        list.split(',')
            .map(str::trim)
            .filter_map(|entry| Some((entry, self.check(entry, &mut regexes).err()?)))
            .collect()
    }

    /// Compile `entry` if it is not kept; `regexes` counts the entries of its list that are no
    /// name (regular expressions, and entries that fail as one), counted before any compile.
    fn check(&mut self, entry: &str, regexes: &mut usize) -> Result<(), Refused> {
        if !is_name(entry) {
            *regexes += 1;
            if *regexes > PER_LIST {
                return Err(Refused::TooMany);
            }
        }
        self.clock += 1;
        if let Some(kept) = self.kept.get_mut(entry) {
            kept.used = self.clock;
        } else {
            let matcher = Matcher::of(entry);
            let bytes = matcher.as_ref().map_or(entry.len() + 64, |m| m.bytes(entry));
            self.make_room(bytes);
            self.bytes += bytes;
            self.kept.insert(entry.into(), Kept { matcher, bytes, used: self.clock });
        }
        match &self.kept[entry].matcher {
            Err(err) => Err(Refused::Invalid(err.clone())),
            Ok(_) => Ok(()),
        }
    }

    fn matches(&mut self, entry: &str, name: &str) -> bool {
        let Some(kept) = self.kept.get_mut(entry) else { return false };
        let Ok(matcher) = kept.matcher.as_mut() else { return false };
        let matched = matcher.is_match(name);
        // A search may grow the regex's cache (up to SEARCH_CACHE): counted as it grows.
        let bytes = matcher.bytes(entry);
        self.bytes = self.bytes + bytes - kept.bytes;
        kept.bytes = bytes;
        if self.bytes > BUDGET {
            self.make_room(0);
        }
        matched
    }

    /// Drop the least recently used entries until `incoming` more bytes fit in the budget.
    fn make_room(&mut self, incoming: usize) {
        while self.bytes + incoming > BUDGET && !self.kept.is_empty() {
            let Some(oldest) = self.kept.iter().min_by_key(|(_, k)| k.used).map(|(e, _)| e.clone()) else { break };
            if let Some(gone) = self.kept.remove(&oldest) {
                self.bytes -= gone.bytes;
            }
        }
    }

    /// Bytes kept now (for tests and the lint's figures).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// One entry on its own, as Reloader builds it: `Ok` when it can be read (the lint's check).
pub fn compile_entry(entry: &str) -> Result<(), String> {
    Matcher::of(entry).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(list: &str, name: &str) -> bool {
        Patterns::default().any_matches(list, name, |_, _| {})
    }

    #[test]
    fn entries_match_as_reloaders_anchored_regexes_do() {
        assert!(matches("web-config", "web-config"));
        assert!(!matches("web-config", "web-config-2"), "anchored");
        assert!(matches("my.cfg", "my.cfg") && matches("my.cfg", "myxcfg"), "a dot is any character");
        assert!(!matches("my.cfg", "my.cfgx"));
        assert!(matches("app-.*", "app-one") && !matches("app-.*", "xapp-one"));
        assert!(matches("a|b", "a-anything"), "not grouped, as Reloader builds it");
        assert!(matches(" x , web ", "web"), "trimmed");
    }

    #[test]
    fn invalid_and_excess_entries_are_refused_and_the_rest_still_count() {
        let mut patterns = Patterns::default();
        let mut refused = Vec::new();
        assert!(patterns.any_matches("[oops, web", "web", |e, why| refused.push((e.to_string(), why))));
        assert!(matches!(&refused[..], [(entry, Refused::Invalid(_))] if entry == "[oops"));
        let list: Vec<String> = (0..PER_LIST + 5).map(|i| format!("cfg-{i}.*")).collect();
        let list = list.join(",");
        let refused = patterns.refused(&list);
        assert_eq!(refused.len(), 5);
        assert!(refused.iter().all(|(_, why)| *why == Refused::TooMany));
        let names: Vec<String> = (0..500).map(|i| format!("name-{i}")).collect();
        assert!(patterns.refused(&names.join(",")).is_empty(), "names do not count against the limit");
    }

    /// Issue 49: 1,300 entries like `\pL{10}a0` in one annotation. Such an entry is past the size
    /// an entry may take;
    /// entries that fit (`\pL`, 50 KB with its cache) are kept within the budget however many
    /// lists hold them, and past 64 a list compiles nothing more.
    #[test]
    fn expensive_patterns_stay_within_the_budget() {
        let mut patterns = Patterns::default();
        let mut refused = Vec::new();
        let list: Vec<String> = (0..1300).map(|i| format!("\\pL{{10}}a{i}")).collect();
        patterns.any_matches(&list.join(","), "ümlautsandmorea0", |_, why| refused.push(why));
        assert_eq!(refused.len(), 1300);
        assert!(matches!(&refused[0], Refused::Invalid(err) if err.contains("exceeded limit")), "{:?}", refused[0]);
        assert!(refused[PER_LIST..].iter().all(|why| *why == Refused::TooMany), "compiled no more than 64");
        for workload in 0..20 {
            let list: Vec<String> = (0..PER_LIST).map(|i| format!("\\pL-{workload}-{i}")).collect();
            patterns.any_matches(&list.join(","), "ümlautsandmorea0", |_, _| {});
            assert!(patterns.bytes() <= BUDGET, "{} bytes kept after workload {workload}", patterns.bytes());
        }
        assert!(patterns.bytes() > BUDGET / 2, "the budget is used: {}", patterns.bytes());
    }
}
