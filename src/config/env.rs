//! Reading settings: byte counts with units, plain counts, yes / no flags,
//! and values left to the host ("auto"), from the process environment or
//! from a group's own settings over it ([`Vars`]).
#![forbid(unsafe_code)]

use std::cell::RefCell;

use super::Setting;

/// Where settings are read from: a group's own settings (`pg_options`),
/// then the process environment (as it is now, or as it was when the
/// process read it). Values that do not parse are noted in
/// [`Vars::rejected`], and the setting keeps its default.
pub(super) struct Vars<'a> {
    over: &'a [(String, String)],
    /// The environment as read earlier; `None`: as it is now.
    base: Option<&'a [(String, String)]>,
    rejected: RefCell<Vec<(String, String)>>,
}

impl<'a> Vars<'a> {
    /// The process environment alone.
    pub(super) fn process() -> Vars<'static> {
        Vars { over: &[], base: None, rejected: RefCell::new(Vec::new()) }
    }

    /// `over` (name, value) pairs first, then the environment now.
    #[cfg(test)]
    pub(super) fn over(over: &'a [(String, String)]) -> Vars<'a> {
        Vars { over, base: None, rejected: RefCell::new(Vec::new()) }
    }

    /// `over` first, then `base` (the environment as read earlier).
    pub(super) fn layered(over: &'a [(String, String)], base: &'a [(String, String)]) -> Vars<'a> {
        Vars { over, base: Some(base), rejected: RefCell::new(Vec::new()) }
    }

    /// The raw value of `name`, if set.
    pub(super) fn var(&self, name: &str) -> Option<String> {
        let find = |pairs: &[(String, String)]| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        match (find(self.over), self.base) {
            (Some(v), _) => Some(v),
            (None, Some(base)) => find(base),
            (None, None) => std::env::var(name).ok(),
        }
    }

    /// A non-empty value of `name`.
    pub(super) fn text(&self, name: &str) -> Option<String> {
        self.var(name).filter(|s| !s.is_empty())
    }

    /// Notes that `name`'s value `v` was not used and why.
    pub(super) fn reject(&self, name: &str, v: &str, why: &str) {
        self.rejected.borrow_mut().push((name.to_string(), format!("{name}={v:?}: {why}")));
    }

    /// (name, "NAME=value: why") of every value that did not parse, in
    /// reading order.
    pub(super) fn rejected(self) -> Vec<(String, String)> {
        self.rejected.into_inner()
    }

    /// Says on stderr which values did not parse (the process's settings:
    /// they keep their defaults).
    pub(super) fn report(self) {
        for (_, why) in self.rejected() {
            eprintln!("rustccl: ignoring {why}");
        }
    }

    /// A byte count, or `None` for unset / empty / "auto" (at most 256 MiB).
    pub(super) fn auto_size(&self, name: &str) -> Option<usize> {
        match self.var(name).as_deref() {
            None | Some("") | Some("auto") => None,
            Some(_) => Some(self.size(name, 1 << 20).min(256 << 20)),
        }
    }

    /// Whether a yes / no setting is on ("1", "true" or "TRUE").
    pub(super) fn flag(&self, name: &str) -> bool {
        matches!(self.var(name).as_deref(), Some("1") | Some("true") | Some("TRUE"))
    }

    /// A yes / no setting that may be left to rustccl: [`Setting::Auto`]
    /// unset or "auto", else whether it is on as [`Vars::flag`] reads it.
    pub(super) fn flag_setting(&self, name: &str) -> Setting<bool> {
        match self.var(name) {
            Some(v) if v.trim() != "auto" => Setting::Fixed(matches!(v.as_str(), "1" | "true" | "TRUE")),
            _ => Setting::Auto,
        }
    }

    /// A byte count that may be left to rustccl: [`Setting::Auto`] unset,
    /// "auto", or 0 where `zero_is_auto`; one of `words` stands for its
    /// value (e.g. `("off", NEVER)`).
    pub(super) fn size_setting(&self, name: &str, zero_is_auto: bool, words: &[(&str, usize)]) -> Setting<usize> {
        self.setting(name, zero_is_auto, words, |v| v.size(name, 0))
    }

    /// As [`Vars::size_setting`] for a plain count ([`Vars::count`]).
    pub(super) fn count_setting(&self, name: &str, zero_is_auto: bool, words: &[(&str, usize)]) -> Setting<usize> {
        self.setting(name, zero_is_auto, words, |v| v.count(name, 0))
    }

    fn setting(&self, name: &str, zero_is_auto: bool, words: &[(&str, usize)], read: impl Fn(&Self) -> usize) -> Setting<usize> {
        let Some(v) = self.var(name) else { return Setting::Auto };
        if v.trim() == "auto" || v.trim().is_empty() {
            return Setting::Auto;
        }
        if let Some(x) = self.word(name, words) {
            return Setting::Fixed(x);
        }
        let before = self.rejected.borrow().len();
        match read(self) {
            _ if self.rejected.borrow().len() > before => Setting::Auto,
            0 if zero_is_auto => Setting::Auto,
            x => Setting::Fixed(x),
        }
    }

    /// A setting that is on unless set to 0 / false / off.
    pub(super) fn on(&self, name: &str) -> bool {
        !matches!(self.var(name).as_deref().map(str::trim), Some("0" | "false" | "FALSE" | "off"))
    }

    /// A byte count ([`parse_size`]); unset: `default`.
    pub(super) fn size(&self, name: &str, default: usize) -> usize {
        match self.var(name) {
            Some(v) => parse_size(&v).unwrap_or_else(|| {
                self.reject(name, &v, "not a byte count");
                default
            }),
            None => default,
        }
    }

    /// The value of the word the setting is set to, if it is one of `words`.
    fn word(&self, name: &str, words: &[(&str, usize)]) -> Option<usize> {
        let v = self.var(name)?;
        words.iter().find(|(w, _)| *w == v.trim()).map(|&(_, x)| x)
    }

    /// A setting that counts something other than bytes (threads, entries,
    /// microseconds): a plain whole number; anything else is rejected.
    pub(super) fn count(&self, name: &str, default: usize) -> usize {
        match self.var(name) {
            Some(v) => v.trim().parse().unwrap_or_else(|_| {
                self.reject(name, &v, "not a whole number");
                default
            }),
            None => default,
        }
    }
}

/// Whether a yes / no setting is on ("1", "true" or "TRUE") in the
/// environment, read now.
pub fn env_flag(name: &str) -> bool {
    Vars::process().flag(name)
}

/// Parses "65536", "64K", "64KiB", "1M", "2MiB".
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: usize = num.parse().ok()?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("65536"), Some(65536));
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("2MiB"), Some(2 << 20));
        assert_eq!(parse_size("x"), None);
    }

    fn over(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn counts_take_plain_numbers_only() {
        let o = over(&[("RUSTCCL_TEST_COUNT_PLAIN", " 12 "), ("RUSTCCL_TEST_COUNT_UNIT", "64K")]);
        let v = Vars::over(&o);
        assert_eq!(v.count("RUSTCCL_TEST_COUNT_PLAIN", 3), 12);
        assert_eq!(v.count("RUSTCCL_TEST_COUNT_UNIT", 3), 3, "a byte unit on a count is rejected");
        assert_eq!(v.count("RUSTCCL_TEST_COUNT_UNSET", 3), 3);
        assert_eq!(v.size("RUSTCCL_TEST_COUNT_UNIT", 3), 65536);
        let rejected = v.rejected();
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        assert_eq!(rejected[0].0, "RUSTCCL_TEST_COUNT_UNIT");
        assert!(rejected[0].1.contains("not a whole number"), "{rejected:?}");
    }

    #[test]
    fn auto_words_and_numbers_read_as_settings() {
        use super::Setting::{Auto, Fixed};
        let words = [("off", usize::MAX)];
        for (value, zero_auto, want) in [
            (" off ", false, Fixed(usize::MAX)),
            ("auto", false, Auto),
            ("", false, Auto),
            ("2M", false, Fixed(2 << 20)),
            ("0", false, Fixed(0)),
            ("0", true, Auto),
            ("never", false, Auto),
        ] {
            let o = over(&[("RUSTCCL_TEST_WORDS", value)]);
            let v = Vars::over(&o);
            assert_eq!(v.size_setting("RUSTCCL_TEST_WORDS", zero_auto, &words), want, "{value:?}");
            assert_eq!(v.rejected().len(), (value == "never") as usize, "{value:?}");
        }
        let o = over(&[("RUSTCCL_TEST_COUNT_WORDS", "64K")]);
        assert_eq!(Vars::over(&o).count_setting("RUSTCCL_TEST_COUNT_WORDS", false, &[]), Auto, "a byte unit on a count is rejected");
        assert_eq!(Vars::process().size_setting("RUSTCCL_TEST_WORDS_UNSET", false, &words), Auto);
    }

    #[test]
    fn auto_flags_read_once_as_flags() {
        use super::Setting::{Auto, Fixed};
        for (value, want) in
            [(" auto ", Auto), ("1", Fixed(true)), ("true", Fixed(true)), ("0", Fixed(false)), ("", Fixed(false)), (" 1", Fixed(false))]
        {
            let o = over(&[("RUSTCCL_TEST_AUTO_FLAG", value)]);
            assert_eq!(Vars::over(&o).flag_setting("RUSTCCL_TEST_AUTO_FLAG"), want, "{value:?}");
        }
        assert_eq!(Vars::process().flag_setting("RUSTCCL_TEST_AUTO_FLAG_UNSET"), Auto);
    }

    #[test]
    fn a_groups_own_settings_come_before_the_environment() {
        // A name no other test reads, so setting it races with nothing.
        std::env::set_var("RUSTCCL_TEST_OVER", "5");
        let o = over(&[("RUSTCCL_TEST_OVER", "6")]);
        assert_eq!(Vars::over(&o).count("RUSTCCL_TEST_OVER", 1), 6);
        assert_eq!(Vars::process().count("RUSTCCL_TEST_OVER", 1), 5);
        assert_eq!(Vars::over(&o).count("RUSTCCL_TEST_OVER_UNSET", 1), 1);
    }
}
